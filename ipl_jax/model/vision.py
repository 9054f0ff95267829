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
from flax import struct

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import dense, layer_norm, quick_gelu, remat_body, segment_attention
from ipl_jax.model.rope import apply_rotary, vision_cos_sin
from ipl_jax.model.vision25 import encode_images_qwen25

_LN_EPS = 1e-6


@struct.dataclass
class VisionInputs:
    """Padded patches of every image of a batch.

    patches: f32[P, C*T*ps*ps] (the processor's ``pixel_values`` rows, zero rows for padding)
    pos_hw: int32[P, 2] (row, column of each patch in its image grid, block-major over merge blocks)
    segment_ids: int32[P] (index of the image's temporal slice, -1 for padding)
    P is a multiple of ``merge_factor``; merged outputs number P // merge_factor.
    """

    patches: jnp.ndarray
    pos_hw: jnp.ndarray
    segment_ids: jnp.ndarray


def _vision_block(cfg: Qwen2VLConfig, x, bp, cos, sin, seg):
    """One pre-norm ViT block. x: [P, E]; cos/sin: f32[P, hd]; seg: int32[P] segment ids."""
    v = cfg.vision
    dtype = x.dtype
    p_len = x.shape[0]
    h = layer_norm(bp["norm1"], x, _LN_EPS)
    qkv = dense(bp["attn"]["qkv"], h, dtype).reshape(p_len, 3, v.num_heads, v.head_dim)
    q, k, val = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [P, heads, hd]
    cq, sq = cos[:, None, :], sin[:, None, :]
    q = apply_rotary(q.astype(jnp.float32), cq, sq).astype(dtype)
    k = apply_rotary(k.astype(jnp.float32), cq, sq).astype(dtype)
    o = segment_attention(q[None], k[None], val[None], seg[None], seg[None], cfg.attention_query_chunk, cfg.attention)
    o = o[0].reshape(p_len, v.embed_dim)
    x = x + dense(bp["attn"]["proj"], o, dtype)
    h = layer_norm(bp["norm2"], x, _LN_EPS)
    h = dense(bp["mlp"]["fc2"], quick_gelu(dense(bp["mlp"]["fc1"], h, dtype)), dtype)
    return x + h


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
        return _vision_block(cfg, x, bp, cos, sin, seg), None

    x, _ = jax.lax.scan(remat_body(body, remat), x, vp["blocks"])
    mp = vp["merger"]
    h = layer_norm(mp["ln_q"], x, _LN_EPS).reshape(-1, v.merge_factor * v.embed_dim)
    h = dense(mp["mlp_0"], h, dtype)
    h = jax.nn.gelu(h, approximate=False)
    h = dense(mp["mlp_2"], h, dtype)
    return h.astype(jnp.float32)


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
