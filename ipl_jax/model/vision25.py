"""The Qwen2.5-VL vision tower (RMSNorm, SwiGLU MLP, windowed attention) on ``vision_common.VisionInputs``.

The merged tokens are permuted on device into window order (windows contiguous, pads last) and back, so image
sizes stay traced; ``fullatt_block_indexes`` blocks attend within an image, the others within a window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import dense, remat_body, rms_norm
from ipl_jax.model.rope import vision_cos_sin
from ipl_jax.model.vision_common import VisionInputs, merge_patches, vision_block

_NORM_EPS = 1e-6


def window_order(pos_hw: jnp.ndarray, segment_ids: jnp.ndarray, cfg: Qwen2VLConfig):
    """The window permutation of the merged tokens, on device: pos_hw int32[P, 2], segment_ids int32[P] ->
    (perm, inverse, window) int32[N] with ``x[perm][inverse] == x``; pads share the last window.
    """
    v = cfg.vision
    m, ws, mf = v.spatial_merge_size, v.window_tokens, v.merge_factor
    seg = segment_ids[::mf]
    first = pos_hw[::mf]  # the top-left patch of each merge group
    seg_key = jnp.where(seg < 0, jnp.iinfo(jnp.int32).max, seg)
    win_row = first[:, 0] // m // ws
    win_col = first[:, 1] // m // ws
    iota = jnp.arange(seg.shape[0], dtype=jnp.int32)
    # Stable: inside one window the merged tokens keep their raster order, as in transformers.
    s_seg, s_row, s_col, perm = jax.lax.sort((seg_key, win_row, win_col, iota), num_keys=3, is_stable=True)
    starts = (s_seg[1:] != s_seg[:-1]) | (s_row[1:] != s_row[:-1]) | (s_col[1:] != s_col[:-1])
    window = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), jnp.int32), starts.astype(jnp.int32)]))
    inverse = jnp.zeros_like(perm).at[perm].set(iota)
    return perm, inverse, window


def _rms_norm(p, x):
    return rms_norm(p, x, _NORM_EPS)


def _mlp(mp, h, dtype):  # SwiGLU with biases
    return dense(mp["down_proj"], jax.nn.silu(dense(mp["gate_proj"], h, dtype)) * dense(mp["up_proj"], h, dtype), dtype)


def encode_images_qwen25(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False) -> jnp.ndarray:
    """ViT + merger of Qwen2.5-VL on rows of patches (leaves [N, P, ...], each row windowed on its own).
    Returns f32[N * P // merge_factor, hidden] in the input's merged-token order (as ``vision.encode_images``)."""
    v = cfg.vision
    mf = v.merge_factor
    n, p = vision.segment_ids.shape
    dtype = jnp.dtype(cfg.dtype)
    vp = params["visual"]
    perm, inverse, window = jax.vmap(lambda hw, seg: window_order(hw, seg, cfg))(vision.pos_hw, vision.segment_ids)

    def to_windows(a):  # [N, P, ...] -> the same rows with merge groups in window order
        groups = a.reshape((n, p // mf, mf) + a.shape[2:])
        return jax.vmap(lambda g, i: jnp.take(g, i, axis=0))(groups, perm).reshape(a.shape)

    # The patch embedding is row-wise, so permuting its input equals permuting its output (transformers).
    x = dense(vp["patch_embed"], to_windows(vision.patches), dtype)  # [N, P, E]
    cos, sin = vision_cos_sin(to_windows(vision.pos_hw), v)
    seg_slice = to_windows(vision.segment_ids)
    seg_window = jnp.repeat(window, mf, axis=1)
    # transformers tests `block in fullatt_block_indexes`: indexes outside 0..depth-1 never match
    full = np.isin(np.arange(v.depth), v.fullatt_block_indexes)

    def body(x, xs):
        bp, is_full = xs
        seg = jnp.where(is_full, seg_slice, seg_window)  # whole slice or window
        return vision_block(cfg, _rms_norm, _mlp, x, bp, cos, sin, seg), None

    x, _ = jax.lax.scan(remat_body(body, remat), x, (vp["blocks"], jnp.asarray(full)))
    merged = merge_patches(cfg, _rms_norm, vp["merger"], x).reshape(n, p // mf, -1)
    return jax.vmap(lambda a, i: jnp.take(a, i, axis=0))(merged, inverse).reshape(n * (p // mf), -1)


def window_index_host(grid_thw, cfg: Qwen2VLConfig) -> tuple[np.ndarray, np.ndarray]:
    """transformers' window bookkeeping in numpy, for images packed in order (tests).

    grid_thw: int[n, 3]. Returns (window_index int64[N], N = sum(t*h*w) / merge_factor; cu_window_seqlens
    int32[W + 1], cumulative window lengths in patches).
    """
    v = cfg.vision
    m, ws, mf = v.spatial_merge_size, v.window_tokens, v.merge_factor
    index, cu, base = [], [0], 0
    for t, h, w in np.asarray(grid_thw, np.int64).reshape(-1, 3):
        gh, gw = int(h) // m, int(w) // m
        grid = np.arange(t * gh * gw).reshape(t, gh, gw) + base
        for s in range(t):
            for r in range(0, gh, ws):
                for c in range(0, gw, ws):
                    win = grid[s, r : r + ws, c : c + ws].ravel()
                    index.append(win)
                    cu.append(cu[-1] + win.size * mf)
        base += t * gh * gw
    flat = np.concatenate(index) if index else np.zeros((0,), np.int64)
    return flat.astype(np.int64), np.asarray(cu, np.int32)
