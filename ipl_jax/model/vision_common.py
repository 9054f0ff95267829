"""What the Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers share: the packed patch inputs, the pre-norm block and the
patch merger. Norm and MLP are passed in; blocks run on patch rows [N, P, E] (N = 1 packed, N = images per slot).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import dense, segment_attention, shard_rows
from ipl_jax.model.rope import apply_rotary

Norm = Callable[[dict, jnp.ndarray], jnp.ndarray]


@struct.dataclass
class VisionInputs:
    """Padded patches of a batch: patches f32[P, C*T*ps*ps], pos_hw int32[P, 2] (block-major), segment_ids int32[P]
    (-1 pad); P a multiple of ``merge_factor``.
    """

    patches: jnp.ndarray
    pos_hw: jnp.ndarray
    segment_ids: jnp.ndarray


def attention_residual(cfg: Qwen2VLConfig, norm: Norm, x, bp, cos, sin, seg, lengths=None):
    """x + proj(attention(rope(qkv(norm1(x))))) of one pre-norm block, attending within ``seg``.

    x: [N, P, E]; cos/sin: f32[N, P, hd]; seg: int32[N, P] (-1 pad); lengths: None or int32[N] (row n is one
    segment of ``lengths[n]`` patches then padding)."""
    v = cfg.vision
    dtype = x.dtype
    n, p_len = x.shape[:2]
    x = shard_rows(x)
    h = norm(bp["norm1"], x)
    qkv = dense(bp["attn"]["qkv"], h, dtype).reshape(n, p_len, 3, v.num_heads, v.head_dim)
    q, k, val = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [N, P, heads, hd]
    cq, sq = cos[:, :, None, :], sin[:, :, None, :]
    q = apply_rotary(q.astype(jnp.float32), cq, sq).astype(dtype)  # rotation in f32, as transformers does
    k = apply_rotary(k.astype(jnp.float32), cq, sq).astype(dtype)
    o = segment_attention(q, k, val, seg, seg, cfg.attention_query_chunk, cfg.attention, lengths)
    return x + dense(bp["attn"]["proj"], o.reshape(n, p_len, v.embed_dim), dtype)


def vision_block(cfg: Qwen2VLConfig, norm: Norm, mlp: Callable, x, bp, cos, sin, seg, lengths=None):
    """One pre-norm block: ``attention_residual`` then x + mlp(bp["mlp"], norm2(x), dtype)."""
    x = attention_residual(cfg, norm, x, bp, cos, sin, seg, lengths)
    return x + mlp(bp["mlp"], norm(bp["norm2"], x), x.dtype)


def merge_patches(cfg: Qwen2VLConfig, norm: Norm, mp: dict, x, postshuffle: bool = False) -> jnp.ndarray:
    """The merger: norm, each run of ``merge_factor`` patches concatenated, a GELU MLP (``postshuffle``: the norm
    after the concatenation, Qwen3-VL's DeepStack mergers). x: [N, P, E] -> f32[N * P // merge_factor, hidden]
    (rows in order)."""
    v = cfg.vision
    dtype = jnp.dtype(cfg.dtype)
    width = v.merge_factor * v.embed_dim
    h = norm(mp["ln_q"], x.reshape(-1, width)) if postshuffle else norm(mp["ln_q"], x).reshape(-1, width)
    h = dense(mp["mlp_0"], h, dtype)
    h = jax.nn.gelu(h, approximate=False)
    h = dense(mp["mlp_2"], h, dtype)
    return h.astype(jnp.float32)
