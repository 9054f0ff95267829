"""The benchmarks' model: a Qwen2-VL config built from a size table (tools/bench_tree.py, tools/bench_tdpo.py,
tools/bench_precision.py), and the sizes they share: model dimensions, screenshot grid and the text around it."""

from __future__ import annotations

from ipl_jax.model.config import Qwen2VLConfig, TextConfig, VisionConfig

# "53m": 53M parameters, 529 image tokens per step; "12m": about 12M parameters, 144 image tokens per step.
SIZES = {
    "53m": dict(
        hidden=512,
        layers=8,
        heads=8,
        kv_heads=4,
        inter=2048,
        vocab=16384,
        v_dim=256,
        v_depth=4,
        v_heads=4,
        grid=(1, 46, 46),
        text_before=12,
        text_after=24,
    ),
    "12m": dict(
        hidden=256,
        layers=4,
        heads=4,
        kv_heads=2,
        inter=1024,
        vocab=8192,
        v_dim=128,
        v_depth=2,
        v_heads=2,
        grid=(1, 24, 24),
        text_before=8,
        text_after=16,
    ),
    # the smallest: the scripts' CPU modes in the test suite (seconds, mostly compiling)
    "tiny": dict(
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        inter=128,
        vocab=512,
        v_dim=32,
        v_depth=1,
        v_heads=2,
        grid=(1, 4, 4),
        text_before=4,
        text_after=4,
    ),
}


def bench_model(s: dict) -> Qwen2VLConfig:
    """A Qwen2-VL config from ``s``: hidden, layers, heads, kv_heads, inter, vocab, v_dim, v_depth, v_heads. The
    M-RoPE sections split half the head dimension 1 : 1.5 : 1.5 (like Qwen2-VL's 16 / 24 / 24); the special
    tokens take the top of the vocabulary."""
    head_dim = s["hidden"] // s["heads"]
    half = head_dim // 2
    t_sec = half // 4
    h_sec = (half - t_sec) // 2
    v = s["vocab"]
    return Qwen2VLConfig(
        vision=VisionConfig(
            depth=s["v_depth"], embed_dim=s["v_dim"], hidden_size=s["hidden"], num_heads=s["v_heads"], mlp_ratio=4
        ),
        text=TextConfig(
            vocab_size=v,
            hidden_size=s["hidden"],
            intermediate_size=s["inter"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            rms_norm_eps=1e-6,
            mrope_section=(t_sec, h_sec, half - t_sec - h_sec),
            eos_token_id=(v - 1,),
            bos_token_id=0,
            pad_token_id=0,
        ),
        image_token_id=v - 4,
        video_token_id=v - 3,
        vision_start_token_id=v - 6,
        vision_end_token_id=v - 5,
    )
