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
from ipl_jax.model.layers import dense, layer_norm, quick_gelu, remat_body
from ipl_jax.model.rope import vision_cos_sin
from ipl_jax.model.vision25 import encode_images_qwen25
from ipl_jax.model.vision_common import VisionInputs, merge_patches, vision_block

__all__ = ["VisionInputs", "encode_images", "encode_images_unjitted", "merged_valid"]

_LN_EPS = 1e-6


def _layer_norm(p, x):
    return layer_norm(p, x, _LN_EPS)


def _mlp(mp, h, dtype):
    return dense(mp["fc2"], quick_gelu(dense(mp["fc1"], h, dtype)), dtype)


def encode_images_unjitted(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False) -> jnp.ndarray:
    """Runs the ViT + merger. Returns image features f32[P // merge_factor, hidden]; rows past the real merged
    tokens (pad patches) hold finite garbage and must not be scattered into the text. ``remat``: a policy of
    ``layers.REMAT_POLICIES`` for each block in the backward pass. Leaves [N, Pi, ...] (one image per slot) go
    to ``slot_image_features``."""
    if vision.patches.ndim == 3:  # one image per slot (inputs.prepare_vision_slots): each encoded alone
        return slot_image_features(params, cfg, vision, remat)
    if cfg.model_type == "qwen2_5_vl":  # windowed RMSNorm/SwiGLU tower (vision25.py)
        return encode_images_qwen25(params, cfg, vision, remat)
    v = cfg.vision
    dtype = jnp.dtype(cfg.dtype)
    vp = params["visual"]
    x = dense(vp["patch_embed"], vision.patches, dtype)  # [P, E]
    cos, sin = vision_cos_sin(vision.pos_hw, v)
    seg = vision.segment_ids

    def body(x, bp):
        return vision_block(cfg, _layer_norm, _mlp, x, bp, cos, sin, seg), None

    x, _ = jax.lax.scan(remat_body(body, remat), x, vp["blocks"])
    return merge_patches(cfg, _layer_norm, vp["merger"], x)


def slot_image_features(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False) -> jnp.ndarray:
    """The tower on images laid out one per slot (leaves [N, Pi, ...], ``inputs.prepare_vision_slots``): each slot
    encoded alone (vmapped), so the cost is linear in the number of images, then the real merged features of all
    slots in slot order, as ``text.embed_tokens`` consumes them: f32[N * Pi / merge, hidden] (fill rows last)."""
    feats = jax.vmap(lambda v: encode_images_unjitted(params, cfg, v, remat))(vision)  # [N, Pi/m, H]
    n, k, h = feats.shape
    m = cfg.vision.merge_factor
    real = (vision.segment_ids >= 0).reshape(n, k, m)[..., 0].reshape(-1)
    (index,) = jnp.nonzero(real, size=n * k, fill_value=0)
    return feats.reshape(n * k, h)[index]


def merged_valid(vision: VisionInputs, cfg: Qwen2VLConfig) -> jnp.ndarray:
    """bool[P // merge_factor]: which rows of ``encode_images``' output are real image tokens."""
    m = cfg.vision.merge_factor
    return (vision.segment_ids >= 0).reshape(-1, m)[:, 0]


encode_images = jax.jit(encode_images_unjitted, static_argnums=(1,), static_argnames=("remat",))
encode_images.__doc__ = encode_images_unjitted.__doc__
