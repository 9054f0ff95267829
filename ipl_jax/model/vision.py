"""The Qwen2-VL vision tower on fixed-shape, padded patch arrays.

All images of a batch are packed along one patch axis, padded to a bucket. ``segment_ids`` says which image
(temporal slice) a patch belongs to; attention is block-diagonal over segments (transformers' cu_seqlens), and
pad patches (segment -1) only see each other, so they never touch real patches. The [P, P] mask is built
one query chunk at a time (``cfg.attention_query_chunk``), so memory grows as P * chunk, not P^2; compute is
still quadratic in the packed patch count, so prefer several calls over one huge bucket. The merger concatenates each
run of ``merge_factor`` (=4) consecutive patches, so the merged output keeps the packing: image features first,
in image order, then the pad rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import dense, layer_norm, quick_gelu
from ipl_jax.model.rope import vision_cos_sin
from ipl_jax.model.vision25 import encode_images_qwen25
from ipl_jax.model.vision_common import VisionInputs, merge_patches, vision_block

__all__ = ["VisionInputs", "encode_images", "encode_images_unjitted", "merged_valid"]

_LN_EPS = 1e-6


def _layer_norm(p, x):
    return layer_norm(p, x, _LN_EPS)


def _mlp(mp, h, dtype):
    return dense(mp["fc2"], quick_gelu(dense(mp["fc1"], h, dtype)), dtype)


def encode_images_unjitted(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs) -> jnp.ndarray:
    """Runs the ViT + merger. Returns image features f32[P // merge_factor, hidden]; rows past the real merged
    tokens (pad patches) hold finite garbage and must not be scattered into the text."""
    if cfg.model_type == "qwen2_5_vl":  # windowed RMSNorm/SwiGLU tower (vision25.py)
        return encode_images_qwen25(params, cfg, vision)
    v = cfg.vision
    dtype = jnp.dtype(cfg.dtype)
    vp = params["visual"]
    x = dense(vp["patch_embed"], vision.patches, dtype)  # [P, E]
    cos, sin = vision_cos_sin(vision.pos_hw, v)
    seg = vision.segment_ids

    def body(x, bp):
        return vision_block(cfg, _layer_norm, _mlp, x, bp, cos, sin, seg), None

    x, _ = jax.lax.scan(body, x, vp["blocks"])
    return merge_patches(cfg, _layer_norm, vp["merger"], x)


def merged_valid(vision: VisionInputs, cfg: Qwen2VLConfig) -> jnp.ndarray:
    """bool[P // merge_factor]: which rows of ``encode_images``' output are real image tokens."""
    m = cfg.vision.merge_factor
    return (vision.segment_ids >= 0).reshape(-1, m)[:, 0]


encode_images = jax.jit(encode_images_unjitted, static_argnums=(1,))
encode_images.__doc__ = encode_images_unjitted.__doc__
