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


def attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Masked softmax attention with grouped key/value heads.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D] with Hq a multiple of Hkv (query head h reads KV head h // (Hq/Hkv),
    i.e. transformers' ``repeat_kv``); mask: bool[B, T, S] (True = may attend). Returns [B, T, Hq, D] in q's dtype.

    Masked scores are set to the dtype's minimum (not -inf), so a query row with no allowed key (a pad) gives
    a finite (uniform) average instead of NaN.
    """
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
