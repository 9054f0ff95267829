"""The Qwen2 text decoder with M-RoPE, as pure functions over a stacked-layer parameter dict.

``decoder_stack`` is the one loop over layers (``lax.scan``); it serves the plain forward, the prefix-packed
forward, prefill and cache extension. Attention specifications:

* key-padding mask bool[B, T]: causal attention restricted to valid keys (left or right padding both work);
* explicit mask bool[B, T, T] (True = query t may attend key s): e.g. prefix packing, where several
  continuations follow one prefix and each attends to the prefix and causally to itself only.

Image features are scattered, in order, into the ``<|image_pad|>`` positions of ``input_ids`` (row-major over
the batch, like transformers' ``masked_scatter``); padding must therefore never use the image token id.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import attention, dense, rms_norm
from ipl_jax.model.rope import apply_rotary, text_cos_sin
from ipl_jax.model.vision import encode_images_unjitted


def embed_tokens(params: dict, cfg: Qwen2VLConfig, input_ids: jnp.ndarray,
                 image_features: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """Token embeddings with image features scattered into image-pad slots.

    input_ids: int32[B, T]; image_features: f32[N, hidden] or None. The k-th image-pad token (row-major)
    receives feature row k. Returns dtype[B, T, hidden].
    """
    dtype = jnp.dtype(cfg.dtype)
    x = jnp.take(params["model"]["embed_tokens"]["embedding"], input_ids, axis=0).astype(dtype)
    if image_features is not None:
        b, t = input_ids.shape
        is_img = input_ids == cfg.image_token_id
        idx = (jnp.cumsum(is_img.reshape(-1).astype(jnp.int32)) - 1).reshape(b, t)
        idx = jnp.clip(idx, 0, image_features.shape[0] - 1)
        feats = jnp.take(image_features, idx, axis=0).astype(dtype)
        x = jnp.where(is_img[..., None], feats, x)
    return x


def attention_mask_from_spec(attention_spec: jnp.ndarray) -> jnp.ndarray:
    """bool[B, T] key-padding mask -> causal & padding bool[B, T, T]; bool[B, T, T] is returned as is."""
    if attention_spec.ndim == 3:
        return attention_spec.astype(bool)
    if attention_spec.ndim != 2:
        raise ValueError(f"attention spec must be bool[B, T] or bool[B, T, T], got shape {attention_spec.shape}")
    t = attention_spec.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    return causal[None] & attention_spec.astype(bool)[:, None, :]


def decoder_stack(params: dict, cfg: Qwen2VLConfig, x: jnp.ndarray, positions: jnp.ndarray, mask: jnp.ndarray,
                  cache_kv=None, attend_cache: bool = False, slots: Optional[jnp.ndarray] = None,
                  remat: bool = False):
    """Runs all decoder layers and the final norm.

    x: dtype[B, T, hidden]; positions: int32[3, B, T].
    mask: bool[B, T, T] without a cache to attend to; bool[B, T, S + T] with ``attend_cache`` (keys are the S
      cache slots followed by the T new tokens).
    cache_kv: (k, v) each dtype[L, B, S, Hkv, D] or None. When given, the new keys/values of every layer are
      written to ``cache[l, b, slots[b, t]]`` (slots int32[B, T]; a slot >= S drops that token).
    Returns (hidden dtype[B, T, hidden], new cache_kv or None).
    """
    t_cfg = cfg.text
    dtype = x.dtype
    b, t, _ = x.shape
    cos, sin = text_cos_sin(positions, t_cfg, dtype)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    layers = params["model"]["layers"]
    n_layers = t_cfg.num_hidden_layers
    batch_idx = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))

    def body(carry, xs):
        x, ck, cv = carry
        lp, i = xs
        h = rms_norm(lp["input_layernorm"], x, t_cfg.rms_norm_eps)
        at = lp["self_attn"]
        q = dense(at["q_proj"], h, dtype).reshape(b, t, t_cfg.num_attention_heads, t_cfg.head_dim)
        k = dense(at["k_proj"], h, dtype).reshape(b, t, t_cfg.num_key_value_heads, t_cfg.head_dim)
        v = dense(at["v_proj"], h, dtype).reshape(b, t, t_cfg.num_key_value_heads, t_cfg.head_dim)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        keys, vals = k, v
        if ck is not None:
            if attend_cache:
                past_k = jax.lax.dynamic_index_in_dim(ck, i, 0, keepdims=False)
                past_v = jax.lax.dynamic_index_in_dim(cv, i, 0, keepdims=False)
                keys = jnp.concatenate([past_k, k.astype(ck.dtype)], axis=1).astype(dtype)
                vals = jnp.concatenate([past_v, v.astype(cv.dtype)], axis=1).astype(dtype)
            ck = ck.at[i, batch_idx, slots].set(k.astype(ck.dtype), mode="drop")
            cv = cv.at[i, batch_idx, slots].set(v.astype(cv.dtype), mode="drop")
        o = attention(q, keys, vals, mask, cfg.attention_query_chunk)
        o = o.reshape(b, t, t_cfg.num_attention_heads * t_cfg.head_dim)
        x = x + dense(at["o_proj"], o, dtype)
        h = rms_norm(lp["post_attention_layernorm"], x, t_cfg.rms_norm_eps)
        mp = lp["mlp"]
        h = dense(mp["down_proj"], jax.nn.silu(dense(mp["gate_proj"], h, dtype)) * dense(mp["up_proj"], h, dtype),
                  dtype)
        return (x + h, ck, cv), None

    if remat:
        body = jax.checkpoint(body)
    ck, cv = cache_kv if cache_kv is not None else (None, None)
    (x, ck, cv), _ = jax.lax.scan(body, (x, ck, cv), (layers, jnp.arange(n_layers)))
    x = rms_norm(params["model"]["norm"], x, t_cfg.rms_norm_eps)
    return x, (None if cache_kv is None else (ck, cv))


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
    x = embed_tokens(params, cfg, input_ids, image_features)
    mask = attention_mask_from_spec(attention_spec)
    hidden, _ = decoder_stack(params, cfg, x, positions, mask, remat=remat)
    return hidden


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("remat",))
def forward_hidden(params: dict, cfg: Qwen2VLConfig, input_ids: jnp.ndarray, positions: jnp.ndarray,
                   attention_spec: jnp.ndarray, image_features: Optional[jnp.ndarray] = None,
                   remat: bool = False) -> jnp.ndarray:
    """Final-norm hidden states dtype[B, T, hidden].

    input_ids: int32[B, T]; positions: int32[3, B, T] (M-RoPE rows T, H, W); attention_spec: bool[B, T]
    (key padding, causal) or bool[B, T, T] (explicit, True = may attend); image_features: f32[N, hidden] or
    None; remat: rematerialise each layer in the backward pass (saves activation memory when training).
    """
    return _forward_hidden(params, cfg, input_ids, positions, attention_spec, image_features, remat)


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("remat",))
def forward(params: dict, cfg: Qwen2VLConfig, input_ids: jnp.ndarray, positions: jnp.ndarray,
            attention_spec: jnp.ndarray, image_features: Optional[jnp.ndarray] = None,
            remat: bool = False) -> jnp.ndarray:
    """Logits f32[B, T, V]; arguments as in ``forward_hidden``."""
    hidden = _forward_hidden(params, cfg, input_ids, positions, attention_spec, image_features, remat)
    return logits_from_hidden(params, cfg, hidden)


def token_log_probs(params: dict, cfg: Qwen2VLConfig, hidden: jnp.ndarray, targets: jnp.ndarray,
                    chunk: int = 128) -> jnp.ndarray:
    """log p(targets) f32[B, T] from hidden [B, T, hidden], materialising logits for ``chunk`` positions at a
    time (T must be a multiple of ``chunk`` or smaller than it). targets: int32[B, T]."""
    b, t, h = hidden.shape
    c = min(chunk, t)
    if t % c:
        raise ValueError(f"sequence length {t} is not a multiple of the chunk {c}")

    @jax.checkpoint
    def one(args):
        hid, tgt = args  # [B, c, H], [B, c]
        logits = logits_from_hidden(params, cfg, hid)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
        return picked - lse

    hs = hidden.reshape(b, t // c, c, h).swapaxes(0, 1)
    ts = targets.reshape(b, t // c, c).swapaxes(0, 1)
    out = jax.lax.map(one, (hs, ts))  # [t/c, B, c]
    return out.swapaxes(0, 1).reshape(b, t)


@functools.partial(jax.jit, static_argnums=(1,))
def forward_inputs(params: dict, cfg: Qwen2VLConfig, inputs) -> jnp.ndarray:
    """Logits f32[B, T, V] for a prepared ``ModelInputs`` batch (images encoded, causal + key padding)."""
    feats = None if inputs.vision is None else encode_images_unjitted(params, cfg, inputs.vision)
    hidden = _forward_hidden(params, cfg, inputs.input_ids, inputs.positions, inputs.attention_mask, feats)
    return logits_from_hidden(params, cfg, hidden)
