"""Our logits vs transformers' (eager, float32, CPU) on one random left-padded batch with images of several sizes
(the library behind ``ipl-jax check-parity``).
"""

from __future__ import annotations

import jax
import numpy as np

from ipl_jax.model import hf_config
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import prepare_inputs
from ipl_jax.model.text import forward_inputs
from ipl_jax.model.weights import load_params

# Image grids (t, h, w) in patches: merged 2x3 and 3x2 (odd along one side).
DEFAULT_GRIDS = ((1, 4, 6), (1, 6, 4))
# Qwen2.5-VL: merged 5x6 spans several attention windows (4x4 merged in real checkpoints) with cut edges.
WINDOW_GRIDS = ((1, 10, 12), (1, 6, 4))


def random_batch(cfg: Qwen2VLConfig, rng: np.random.Generator, grids=DEFAULT_GRIDS, text_len: int = 12):
    """Left-padded ids int64[2, T], mask int64[2, T], pixel_values f32[N, patch_dim], grids int64[n, 3].

    Row 0: text, image grids[0], text, image grids[1], text; row 1: text, image grids[1], text. Text ids avoid
    special ids.
    """
    v = cfg.vision
    special = {cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id}
    hi = min(cfg.text.vocab_size, 151643)

    def text(n):
        out = []
        while len(out) < n:
            x = int(rng.integers(0, hi))
            if x not in special:
                out.append(x)
        return out

    def image(g):
        n = g[0] * (g[1] // v.spatial_merge_size) * (g[2] // v.spatial_merge_size)
        return [cfg.vision_start_token_id] + [cfg.image_token_id] * n + [cfg.vision_end_token_id]

    rows = [
        text(text_len) + image(grids[0]) + text(3) + image(grids[1]) + text(4),
        text(text_len // 2) + image(grids[1]) + text(2),
    ]
    used = [grids[0], grids[1], grids[1]]
    pixel_values = np.concatenate(
        [rng.standard_normal((g[0] * g[1] * g[2], v.patch_dim)).astype(np.float32) for g in used]
    )
    t = max(len(r) for r in rows)
    ids = np.zeros((2, t), np.int64)
    mask = np.zeros((2, t), np.int64)
    for i, r in enumerate(rows):
        ids[i, t - len(r) :] = r
        mask[i, t - len(r) :] = 1
    return ids, mask, pixel_values, np.asarray(used, np.int64)


def compare(model_dir: str, seed: int = 0) -> dict:
    """Runs both models on one random batch; returns the comparison as a dict."""
    import torch  # the reference stack (the test extra), needed by this comparison only
    import transformers

    params, cfg = load_params(model_dir, dtype="float32")
    cfg = cfg.replace(dtype="float32")
    qwen25 = cfg.model_type == "qwen2_5_vl"
    ids, mask, pv, grids = random_batch(cfg, np.random.default_rng(seed), WINDOW_GRIDS if qwen25 else DEFAULT_GRIDS)

    ref_cls = getattr(transformers, hf_config.ARCHITECTURES[cfg.hf_model_type])
    ref_model = ref_cls.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        ref = (
            ref_model(
                input_ids=torch.as_tensor(ids),
                attention_mask=torch.as_tensor(mask),
                pixel_values=torch.as_tensor(pv),
                image_grid_thw=torch.as_tensor(grids),
                mm_token_type_ids=torch.as_tensor((ids == cfg.image_token_id).astype(np.int64)),
            )
            .logits.float()
            .numpy()
        )

    t = ids.shape[1]
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(t,), patch_buckets=(len(pv),))
    with jax.default_matmul_precision("highest"):
        ours = np.asarray(forward_inputs(params, cfg, inputs))[:, :t]
    valid = mask.astype(bool)
    diff = float(np.max(np.abs(ours - ref)[valid]))
    return {"max_abs_logit_diff": diff, "logit_std": float(ref[valid].std()), "num_tokens": int(valid.sum())}
