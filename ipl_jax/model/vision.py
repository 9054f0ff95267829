"""The vision towers (Qwen2-VL's here; Qwen2.5-VL's and Qwen3-VL's in their modules) on fixed-shape, padded patch
arrays, packed ([P, ...]) or one image per slot ([N, Pi, ...]). Attention is block-diagonal over ``segment_ids``;
merged outputs keep the packing order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import dense, layer_norm, quick_gelu, remat_body
from ipl_jax.model.rope import vision_cos_sin
from ipl_jax.model.vision3 import encode_images_qwen3
from ipl_jax.model.vision25 import encode_images_qwen25
from ipl_jax.model.vision_common import VisionInputs, merge_patches, vision_block

__all__ = ["VisionInputs", "encode_images", "encode_images_unjitted", "merged_valid"]

_LN_EPS = 1e-6


def _layer_norm(p, x):
    return layer_norm(p, x, _LN_EPS)


def _mlp(mp, h, dtype):
    return dense(mp["fc2"], quick_gelu(dense(mp["fc1"], h, dtype)), dtype)


def _tower(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat, lengths) -> jnp.ndarray:
    """ViT + merger on rows of patches (leaves [N, P, ...]): f32[N * P // merge_factor, hidden] (Qwen3-VL:
    (1 + DeepStack taps) * hidden columns, ``vision3.encode_images_qwen3``)."""
    if cfg.model_type == "qwen2_5_vl":  # windowed RMSNorm/SwiGLU tower (vision25.py)
        return encode_images_qwen25(params, cfg, vision, remat)
    if cfg.model_type == "qwen3_vl":  # position table, GELU-tanh MLP, DeepStack (vision3.py)
        return encode_images_qwen3(params, cfg, vision, remat, lengths)
    dtype = jnp.dtype(cfg.dtype)
    vp = params["visual"]
    x = dense(vp["patch_embed"], vision.patches, dtype)  # [N, P, E]
    cos, sin = vision_cos_sin(vision.pos_hw, cfg.vision)
    seg = vision.segment_ids

    def body(x, bp):
        return vision_block(cfg, _layer_norm, _mlp, x, bp, cos, sin, seg, lengths), None

    x, _ = jax.lax.scan(remat_body(body, remat), x, vp["blocks"])
    return merge_patches(cfg, _layer_norm, vp["merger"], x)


@jax.named_scope("vision")
def encode_images_unjitted(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False) -> jnp.ndarray:
    """Runs the ViT + merger: features f32[P // merge_factor, hidden]; rows past the real tokens are garbage.
    Leaves [N, Pi, ...] go to ``slot_image_features``."""
    if vision.patches.ndim == 3:  # one image per slot (inputs.prepare_vision_slots): each encoded alone
        return slot_image_features(params, cfg, vision, remat)
    return _tower(params, cfg, jax.tree.map(lambda a: a[None], vision), remat, None)


def slot_image_features(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False) -> jnp.ndarray:
    """The tower on images one per slot (leaves [N, Pi, ...]): the real merged features in slot order,
    f32[N * Pi / merge, hidden] (fill rows last)."""
    lengths = jnp.sum(vision.segment_ids >= 0, axis=1).astype(jnp.int32)
    feats = _tower(params, cfg, vision, remat, lengths)  # [N * Pi/m, H]
    n, p = vision.segment_ids.shape
    m = cfg.vision.merge_factor
    real = (vision.segment_ids >= 0).reshape(n, p // m, m)[..., 0].reshape(-1)
    (index,) = jnp.nonzero(real, size=n * (p // m), fill_value=0)
    return feats[index]


def merged_valid(vision: VisionInputs, cfg: Qwen2VLConfig) -> jnp.ndarray:
    """bool[P // merge_factor]: which rows of ``encode_images``' output are real image tokens."""
    m = cfg.vision.merge_factor
    return (vision.segment_ids >= 0).reshape(-1, m)[:, 0]


encode_images = jax.jit(encode_images_unjitted, static_argnums=(1,), static_argnames=("remat",))
encode_images.__doc__ = encode_images_unjitted.__doc__
