"""The Qwen3-VL vision tower on ``vision_common.VisionInputs``: the LayerNorm blocks of Qwen2-VL with a GELU-tanh
MLP, a patch bias, learned position embeddings resampled to each image's grid, and DeepStack (the outputs of
``deepstack_visual_indexes`` blocks, each through its own merger, returned beside the merged features).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import dense, layer_norm, remat_body
from ipl_jax.model.rope import vision_cos_sin
from ipl_jax.model.vision_common import VisionInputs, merge_patches, vision_block

_LN_EPS = 1e-6


def _layer_norm(p, x):
    return layer_norm(p, x, _LN_EPS)


def _mlp(mp, h, dtype):  # transformers' gelu_pytorch_tanh
    return dense(mp["fc2"], jax.nn.gelu(dense(mp["fc1"], h, dtype), approximate=True), dtype)


def grid_sizes(pos_hw: jnp.ndarray, segment_ids: jnp.ndarray) -> jnp.ndarray:
    """int32[N, P, 2]: the (height, width) in patches of each patch's image, from pos_hw int32[N, P, 2] and
    segment_ids int32[N, P] (an image's patches are one contiguous run of one segment id)."""
    n, p = segment_ids.shape
    starts = jnp.concatenate([jnp.ones((n, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    run = jnp.cumsum(starts.astype(jnp.int32), axis=1) - 1  # [N, P]: the run of each patch, 0 .. P-1

    def one(hw, r):
        return (jax.ops.segment_max(hw, r, num_segments=p) + 1)[r]

    return jax.vmap(one)(pos_hw, run)


def _axis_taps(index: jnp.ndarray, size: jnp.ndarray, side: int):
    """Bilinear taps (align_corners) of positions ``index`` on an axis of ``size`` into a table side of ``side``:
    (int32[..., 2] taps clamped to the table, f32[..., 2] weights), as transformers'
    ``_interpolation_axis_taps_weights``."""
    src = index.astype(jnp.float32) * jnp.float32(side - 1) / jnp.maximum(size - 1, 1).astype(jnp.float32)
    floor = jnp.floor(src)
    offsets = jnp.arange(2, dtype=jnp.int32)
    taps = jnp.clip(floor.astype(jnp.int32)[..., None] + offsets, 0, side - 1)
    weights = jnp.maximum(1 - jnp.abs(src[..., None] - floor[..., None] - offsets.astype(jnp.float32)), 0)
    return taps, weights


def position_embeddings(table: jnp.ndarray, vision: VisionInputs, cfg: Qwen2VLConfig) -> jnp.ndarray:
    """The learned square position table [side * side, E] resampled bilinearly (align_corners) to each image's
    grid, at each patch: f32[N, P, E] (leaves of ``vision`` [N, P, ...])."""
    side = cfg.vision.position_grid_side
    size = grid_sizes(vision.pos_hw, vision.segment_ids)
    h_taps, h_w = _axis_taps(vision.pos_hw[..., 0], size[..., 0], side)
    w_taps, w_w = _axis_taps(vision.pos_hw[..., 1], size[..., 1], side)
    lead = h_taps.shape[:-1]
    index = (h_taps[..., :, None] * side + w_taps[..., None, :]).reshape(lead + (4,))
    weights = (h_w[..., :, None] * w_w[..., None, :]).reshape(lead + (4,))
    rows = jnp.take(table, index, axis=0).astype(jnp.float32)  # [N, P, 4, E]
    return jnp.sum(rows * weights[..., None], axis=-2)


def encode_images_qwen3(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False, lengths=None):
    """ViT + merger of Qwen3-VL on rows of patches (leaves [N, P, ...]; ``lengths`` as ``vision_block``'s). Returns
    f32[N * P // merge_factor, (1 + K) * hidden]: each merged token's feature, then its K DeepStack features in
    ``deepstack_taps`` order (the decoder layer each is added after)."""
    v = cfg.vision
    dtype = jnp.dtype(cfg.dtype)
    vp = params["visual"]
    x = dense(vp["patch_embed"], vision.patches, dtype)  # [N, P, E], with the patch bias
    x = x + position_embeddings(vp["pos_embed"]["embedding"], vision, cfg).astype(dtype)
    cos, sin = vision_cos_sin(vision.pos_hw, v)
    seg = vision.segment_ids

    def body(x, bp):
        return vision_block(cfg, _layer_norm, _mlp, x, bp, cos, sin, seg, lengths), None

    body = remat_body(body, remat)

    def blocks(start, stop, x):  # the blocks start .. stop-1 as one scan
        if start >= stop:
            return x
        return jax.lax.scan(body, x, jax.tree.map(lambda a: a[start:stop], vp["blocks"]))[0]

    taps, start = [], 0
    for block, merger in v.deepstack_taps:
        x = blocks(start, block + 1, x)
        start = block + 1
        mp = jax.tree.map(lambda a, k=merger: a[k], vp["deepstack_merger"])
        taps.append(merge_patches(cfg, _layer_norm, mp, x, postshuffle=True))
    x = blocks(start, v.depth, x)
    return jnp.concatenate([merge_patches(cfg, _layer_norm, vp["merger"], x)] + taps, axis=-1)
