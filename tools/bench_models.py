"""The benchmarks' models: the sizes they share (``model.sizes.Size``), each with the screenshot grid and the text
around it that its workloads use (tools/bench_tree.py, bench_tdpo.py, bench_precision.py and the sampler
benchmark's CPU mode)."""

from __future__ import annotations

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.sizes import Size, small_config

# hidden, layers, heads, kv heads, MLP width, vocabulary; ViT width, depth, heads
SIZES = {
    "53m": Size(512, 8, 8, 4, 2048, 16384, 256, 4, 4),  # 53M parameters
    "12m": Size(256, 4, 4, 2, 1024, 8192, 128, 2, 2),
    "1m": Size(128, 2, 4, 2, 256, 2048, 64, 1, 2),  # bench_tdpo --quick
    "tiny": Size(64, 2, 4, 2, 128, 512, 32, 1, 2),  # the scripts' CPU modes in the test suite
}
# per size: the screenshot grid (t, h, w patches) and the text tokens before / after it
SCREENS = {
    "53m": dict(grid=(1, 46, 46), text_before=12, text_after=24),  # 529 image tokens per step
    "12m": dict(grid=(1, 24, 24), text_before=8, text_after=16),  # 144
    "1m": dict(grid=(1, 16, 16), text_before=8, text_after=12),  # 64
    "tiny": dict(grid=(1, 4, 4), text_before=4, text_after=4),  # 4
}


def bench_shape(size: str, **workload) -> dict:
    """A benchmark's shape: the model ``size`` (a ``SIZES`` name), its screen (``SCREENS``) and ``workload``."""
    return dict(SCREENS[size], size=size, **workload)


def bench_model(size: str) -> Qwen2VLConfig:
    """The model of ``SIZES[size]``: special ids at the top of the vocabulary, bos and pad id 0."""
    return small_config(SIZES[size], rms_norm_eps=1e-6, bos_token_id=0, pad_token_id=0)
