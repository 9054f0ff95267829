"""Small numeric building blocks shared by the vision tower and the text decoder.

They follow transformers' eager numerics: norms in float32 then cast back, attention scores in the compute
dtype, softmax in float32 cast back to the compute dtype before multiplying by V.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dense(p: dict, x: jnp.ndarray, dtype) -> jnp.ndarray:
    """x @ kernel (+ bias). p: {'kernel': [in, out], optional 'bias': [out]}; x: [..., in] -> dtype[..., out]."""
    y = jnp.einsum("...i,io->...o", x.astype(dtype), p["kernel"].astype(dtype))
    if "bias" in p:
        y = y + p["bias"].astype(dtype)
    return y


def rms_norm(p: dict, x: jnp.ndarray, eps: float) -> jnp.ndarray:
    """weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).astype(x.dtype). p: {'scale': [D]}."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return p["scale"].astype(x.dtype) * y.astype(x.dtype)


def layer_norm(p: dict, x: jnp.ndarray, eps: float) -> jnp.ndarray:
    """LayerNorm computed in float32, cast back to x.dtype. p: {'scale': [D], 'bias': [D]}."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    y = y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)
    return y.astype(x.dtype)


def quick_gelu(x: jnp.ndarray) -> jnp.ndarray:
    return x * jax.nn.sigmoid(1.702 * x)


def _attention_dense(q, k, v, mask):
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qg = q.reshape(b, t, hkv, g, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k) * jnp.asarray(d**-0.5, q.dtype)
    big_neg = jnp.finfo(scores.dtype).min
    scores = jnp.where(mask[:, None, None, :, :], scores, big_neg)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, hq, d)


def _chunked(fn, q: jnp.ndarray, per_query, query_chunk: int) -> jnp.ndarray:
    """fn(q, per_query) evaluated ``query_chunk`` queries at a time. q: [B, T, ...]; per_query: a pytree of
    arrays with the query axis at 1. Chunks run under ``lax.map`` and are rematerialised in the backward pass."""
    t = q.shape[1]
    if not query_chunk or t <= query_chunk:
        return fn(q, per_query)
    n = -(-t // query_chunk)
    pad = n * query_chunk - t

    def split(a):
        a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
        return a.reshape((a.shape[0], n, query_chunk) + a.shape[2:]).swapaxes(0, 1)

    out = jax.lax.map(jax.checkpoint(lambda a: fn(a[0], a[1])), (split(q), jax.tree.map(split, per_query)))
    out = out.swapaxes(0, 1)
    return out.reshape((out.shape[0], n * query_chunk) + out.shape[3:])[:, :t]


def attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray,
              query_chunk: int = 0) -> jnp.ndarray:
    """Masked softmax attention with grouped key/value heads.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D] with Hq a multiple of Hkv (query head h reads KV head h // (Hq/Hkv),
    i.e. transformers' ``repeat_kv``); mask: bool[B, T, S] (True = may attend). Returns [B, T, Hq, D] in q's
    dtype.

    Masked scores are set to the dtype's minimum (not -inf), so a query row with no allowed key (a pad) gives
    a finite (uniform) average instead of NaN. With ``query_chunk`` > 0 and T > query_chunk, queries are
    processed ``query_chunk`` at a time, so the score tensor never exceeds [B, H, query_chunk, S]; the result
    is the same.
    """
    return _chunked(lambda qc, mc: _attention_dense(qc, k, v, mc), q, mask, query_chunk)


def segment_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, q_segments: jnp.ndarray,
                      k_segments: jnp.ndarray, query_chunk: int = 0) -> jnp.ndarray:
    """Block-diagonal attention: query t attends key s iff their segment ids are equal. q_segments:
    int32[B, T], k_segments: int32[B, S]; the [T, S] mask is only ever built one query chunk at a time."""
    def fn(qc, seg):
        return _attention_dense(qc, k, v, seg[:, :, None] == k_segments[:, None, :])

    return _chunked(fn, q, q_segments, query_chunk)
