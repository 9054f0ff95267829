"""The Qwen2 text decoder with M-RoPE, as pure functions over a stacked-layer parameter dict.

Attention specs: key padding bool[B, T] (causal), explicit bool[B, T, T], or packed segment ids int32[B, T]
(0 = shared prefix, 1.. continuations, -1 padding). Image features fill the ``<|image_pad|>`` positions in
row-major order, so padding must never use the image token id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ipl_jax.model import layers
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.experts import sparse_mlp
from ipl_jax.model.layers import dense, masked_attention, remat_body, rms_norm, shard_rows
from ipl_jax.model.rope import apply_rotary, text_cos_sin
from ipl_jax.model.vision import encode_images_unjitted


def embed_tokens(
    params: dict, cfg: Qwen2VLConfig, input_ids: jnp.ndarray, image_features: jnp.ndarray | None = None
) -> jnp.ndarray:
    """Token embeddings with image features scattered into image-pad slots.

    input_ids: int32[B, T]; image_features: f32[N, F] or None (F = hidden, or (1 + taps) * hidden for Qwen3-VL:
    ``deepstack_embeds``). The k-th image-pad token (row-major) receives row k's first ``hidden`` columns.
    Returns dtype[B, T, hidden].
    """
    dtype = jnp.dtype(cfg.dtype)
    x = jnp.take(params["model"]["embed_tokens"]["embedding"], input_ids, axis=0).astype(dtype)
    if image_features is not None:
        is_img, feats = _image_rows(cfg, input_ids, image_features)
        x = jnp.where(is_img[..., None], feats[..., : cfg.text.hidden_size].astype(dtype), x)
    return x


def _image_rows(cfg: Qwen2VLConfig, input_ids, image_features):
    """(bool[B, T] image-pad slots, f32[B, T, F] the feature row of each slot: the k-th slot, row-major, reads
    row k; other slots read a clipped row)."""
    b, t = input_ids.shape
    is_img = input_ids == cfg.image_token_id
    idx = (jnp.cumsum(is_img.reshape(-1).astype(jnp.int32)) - 1).reshape(b, t)
    idx = jnp.clip(idx, 0, image_features.shape[0] - 1)
    return is_img, jnp.take(image_features, idx, axis=0)


def deepstack_embeds(cfg: Qwen2VLConfig, input_ids: jnp.ndarray, image_features: jnp.ndarray | None):
    """Qwen3-VL's DeepStack inputs: dtype[K, B, T, hidden], tap k's features at the image-pad slots (zeros
    elsewhere), added after decoder layer k; None without taps or images. ``image_features`` f32[N, (1 + K) *
    hidden]: each image token's merged feature, then its K DeepStack features (``vision.encode_images``)."""
    k = len(cfg.vision.deepstack_taps)
    if not k or image_features is None:
        return None
    h = cfg.text.hidden_size
    is_img, feats = _image_rows(cfg, input_ids, image_features)
    taps = feats[..., h:].reshape(feats.shape[:2] + (k, h)).astype(jnp.dtype(cfg.dtype))
    return jnp.moveaxis(jnp.where(is_img[..., None, None], taps, 0), 2, 0)


def attention_mask_from_spec(attention_spec: jnp.ndarray) -> jnp.ndarray:
    """The whole mask bool[B, T, T] of a spec; the reference definition the chunked masks follow (never built by
    the forward)."""
    if attention_spec.ndim == 3:
        return attention_spec.astype(bool)
    mask_of, per_query, per_key = spec_masks(attention_spec)
    return mask_of(per_query, per_key)


def _is_packed(spec) -> bool:
    return spec.ndim == 2 and jnp.issubdtype(spec.dtype, jnp.integer)


def spec_masks(spec: jnp.ndarray):
    """(mask_of, per_query, per_key) of a [B, T] spec: mask_of(per-query chunk, per_key) -> bool[B, c, T]
    (``masked_attention``)."""
    if spec.ndim != 2:
        raise ValueError(
            "attention spec must be bool[B, T], int32[B, T] segment ids or bool[B, T, T], got shape "
            f"{spec.shape} {spec.dtype}"
        )
    b, t = spec.shape
    q_pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if _is_packed(spec):
        return _packed_mask, (q_pos, spec.astype(jnp.int32)), spec.astype(jnp.int32)
    return _padded_mask, q_pos, spec.astype(bool)


_spec_masks = spec_masks  # the former private name (tests/test_attention_memory.py)


def _packed_mask(per_query, k_seg):
    """Causal within a segment; segment 0 (a shared prefix) is visible to every segment; -1 (pad) to none."""
    pos, seg = per_query
    k_pos = jnp.arange(k_seg.shape[1], dtype=jnp.int32)
    causal = k_pos[None, None, :] <= pos[:, :, None]
    visible = (k_seg[:, None, :] == 0) | (k_seg[:, None, :] == seg[:, :, None])
    return causal & visible & (seg[:, :, None] >= 0) & (k_seg[:, None, :] >= 0)


def _padded_mask(pos, k_valid):
    """Causal over the valid keys."""
    k_pos = jnp.arange(k_valid.shape[1], dtype=jnp.int32)
    return (k_pos[None, None, :] <= pos[:, :, None]) & k_valid[:, None, :]


def _given_mask(mask, _):
    return mask


def decoder_layer(
    lp: dict, cfg: Qwen2VLConfig, x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray, attend: Callable, kv_dtype=None
):
    """One Qwen2 / Qwen3 decoder layer (pre-norm attention, then pre-norm SwiGLU MLP, both residual); Qwen3
    (``qk_norm``) normalises each head's queries and keys before the rotary; Qwen3-VL-MoE (``num_experts``) has the
    sparse MLP of ``experts.py``. Biases are the parameters' own.

    x: dtype[B, T, hidden]; cos, sin: [B, T, 1, D]; attend(q, k, v) -> dtype[B, T, Hq, D]; kv_dtype: the new
    keys / values are rounded to it before attending. Returns (x, (k, v) [B, T, Hkv, D]).
    """
    t_cfg = cfg.text
    dtype = x.dtype
    b, t, _ = x.shape
    x = shard_rows(x)
    at = lp["self_attn"]
    h = rms_norm(lp["input_layernorm"], x, t_cfg.rms_norm_eps)
    q = dense(at["q_proj"], h, dtype).reshape(b, t, t_cfg.num_attention_heads, t_cfg.head_dim)
    k = dense(at["k_proj"], h, dtype).reshape(b, t, t_cfg.num_key_value_heads, t_cfg.head_dim)
    v = dense(at["v_proj"], h, dtype).reshape(b, t, t_cfg.num_key_value_heads, t_cfg.head_dim)
    if t_cfg.qk_norm:
        q, k = rms_norm(at["q_norm"], q, t_cfg.rms_norm_eps), rms_norm(at["k_norm"], k, t_cfg.rms_norm_eps)
    q = apply_rotary(q, cos, sin)
    k = apply_rotary(k, cos, sin)
    if kv_dtype is not None:
        k, v = k.astype(kv_dtype), v.astype(kv_dtype)
    with jax.named_scope("attention"):
        o = attend(q, k.astype(dtype), v.astype(dtype))
    x = x + dense(at["o_proj"], o.reshape(b, t, t_cfg.num_attention_heads * t_cfg.head_dim), dtype)
    h = rms_norm(lp["post_attention_layernorm"], x, t_cfg.rms_norm_eps)
    mp = lp["mlp"]
    with jax.named_scope("mlp"):
        if t_cfg.num_experts:  # Qwen3-VL-MoE: router and top-k experts
            h = sparse_mlp(mp, t_cfg, h, cfg.moe_dispatch)
        else:
            inner = shard_rows(jax.nn.silu(dense(mp["gate_proj"], h, dtype)) * dense(mp["up_proj"], h, dtype))
            h = dense(mp["down_proj"], inner, dtype)
    return x + h, (k, v)


def decoder_stack(
    params: dict,
    cfg: Qwen2VLConfig,
    x: jnp.ndarray,
    positions: jnp.ndarray,
    attend: Callable,
    kv_dtype=None,
    remat: bool | str = False,
    deepstack: jnp.ndarray | None = None,
):
    """Every decoder layer (one ``lax.scan``) and the final norm: x dtype[B, T, hidden], positions int32[3, B, T],
    attend(q, k, v, layer); deepstack: None or dtype[K, B, T, hidden], added after layers 0 .. K-1
    (``deepstack_embeds``). Returns (hidden, None or (k, v) [L, B, T, Hkv, D] in ``kv_dtype``).
    """
    cos, sin = text_cos_sin(positions, cfg.text, x.dtype)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]

    def body(x, xs):
        lp, i = xs
        x, kv = decoder_layer(lp, cfg, x, cos, sin, lambda q, k, v: attend(q, k, v, i), kv_dtype)
        if deepstack is not None:
            n = deepstack.shape[0]
            x = x + jnp.where(i < n, jax.lax.dynamic_index_in_dim(deepstack, jnp.minimum(i, n - 1), 0, False), 0)
        return x, (kv if kv_dtype is not None else None)

    body = remat_body(body, remat)
    n_layers = cfg.text.num_hidden_layers
    x, kv = jax.lax.scan(body, x, (params["model"]["layers"], jnp.arange(n_layers)))
    return rms_norm(params["model"]["norm"], x, cfg.text.rms_norm_eps), kv


def self_attention(cfg: Qwen2VLConfig, spec: jnp.ndarray) -> Callable:
    """``decoder_stack``'s attend without a cache: the new tokens attend to each other under ``spec``; fused kernels
    get one bool[B, T, T] mask built once outside the layer loop."""
    chunk = cfg.attention_query_chunk
    impl = layers.resolve_attention(cfg.attention, cfg.dtype, (cfg.text.head_dim,))
    if spec.ndim == 3:
        mask, causal = spec.astype(bool), False
    else:
        mask_of, per_query, per_key = spec_masks(spec)
        if impl == "reference":
            return lambda q, k, v, layer: masked_attention(q, k, v, mask_of, per_query, per_key, chunk, impl)
        mask, causal = mask_of(per_query, per_key), True
    return lambda q, k, v, layer: masked_attention(q, k, v, _given_mask, mask, None, chunk, impl, causal=causal)


def logits_from_hidden(params: dict, cfg: Qwen2VLConfig, hidden: jnp.ndarray) -> jnp.ndarray:
    """hidden: [..., hidden] -> logits f32[..., V] (lm_head, or the embedding matrix when tied)."""
    dtype = jnp.dtype(cfg.dtype)
    if cfg.tie_word_embeddings:
        w = params["model"]["embed_tokens"]["embedding"].astype(dtype)  # [V, H]
        out = jnp.einsum("...h,vh->...v", hidden.astype(dtype), w)
    else:
        out = jnp.einsum("...h,hv->...v", hidden.astype(dtype), params["lm_head"]["kernel"].astype(dtype))
    return out.astype(jnp.float32)


def _forward_hidden(params, cfg, input_ids, positions, attention_spec, image_features=None, remat=False):
    """Final-norm hidden states dtype[B, T, hidden]. input_ids: int32[B, T]; positions: int32[3, B, T];
    attention_spec: see the module docstring; image_features: f32[N, hidden] or None; remat: a REMAT_POLICIES policy.
    """
    x = embed_tokens(params, cfg, input_ids, image_features)
    deepstack = deepstack_embeds(cfg, input_ids, image_features)
    attend = self_attention(cfg, attention_spec)
    hidden, _ = decoder_stack(params, cfg, x, positions, attend, remat=remat, deepstack=deepstack)
    return hidden


forward_hidden = jax.jit(_forward_hidden, static_argnums=(1,), static_argnames=("remat",))


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("remat",))
def forward(
    params: dict,
    cfg: Qwen2VLConfig,
    input_ids: jnp.ndarray,
    positions: jnp.ndarray,
    attention_spec: jnp.ndarray,
    image_features: jnp.ndarray | None = None,
    remat: bool = False,
) -> jnp.ndarray:
    """Logits f32[B, T, V]; arguments as in ``forward_hidden``."""
    hidden = _forward_hidden(params, cfg, input_ids, positions, attention_spec, image_features, remat)
    return logits_from_hidden(params, cfg, hidden)


def token_log_probs(
    params: dict,
    cfg: Qwen2VLConfig,
    hidden: jnp.ndarray,
    targets: jnp.ndarray,
    chunk: int = 128,
    needed: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """log p(targets) f32[B, T] from hidden [B, T, hidden], ``chunk`` positions of logits at a time (T a multiple
    of ``chunk`` or smaller). needed: optional bool[B, T]; other positions read 0."""
    b, t, h = hidden.shape
    c = min(chunk, t)
    if t % c:
        raise ValueError(f"sequence length {t} is not a multiple of the chunk {c}")

    @jax.named_scope("logprob_head")
    def logps(hid, tgt):  # [B, c, H], [B, c] -> [B, c]
        logits = logits_from_hidden(params, cfg, hid)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
        return picked - lse

    @jax.checkpoint
    def one(args):
        hid, tgt, need = args
        if need is None:
            return logps(hid, tgt)
        skip = lambda hid, tgt: jnp.zeros(tgt.shape, jnp.float32)
        return jnp.where(need, jax.lax.cond(jnp.any(need), logps, skip, hid, tgt), 0.0)

    split = lambda a: a.reshape((b, t // c, c) + a.shape[2:]).swapaxes(0, 1)
    out = jax.lax.map(one, (split(hidden), split(targets), None if needed is None else split(needed)))  # [t/c, B, c]
    return out.swapaxes(0, 1).reshape(b, t)


@functools.partial(jax.jit, static_argnums=(1,))
def forward_inputs(params: dict, cfg: Qwen2VLConfig, inputs) -> jnp.ndarray:
    """Logits f32[B, T, V] for a prepared ``ModelInputs`` batch (images encoded, causal + key padding)."""
    feats = None if inputs.vision is None else encode_images_unjitted(params, cfg, inputs.vision)
    hidden = _forward_hidden(params, cfg, inputs.input_ids, inputs.positions, inputs.attention_mask, feats)
    return logits_from_hidden(params, cfg, hidden)
