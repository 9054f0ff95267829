"""Drawing one token per row from next-token logits: temperature, top-k, top-p, greedy. The recorded log-prob is
always the untempered, unfiltered log-softmax ``log π(token | prefix)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def filter_logits(logits: jax.Array, temperature, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """``logits / temperature``, then the ``top_k`` largest (0 = all), then the smallest top set of mass ``top_p``
    (1 = all); the rest -inf. logits: f32[R, V]; temperature > 0, may be traced; ties at a threshold are kept.
    """
    x = logits.astype(jnp.float32) / jnp.maximum(jnp.asarray(temperature, jnp.float32), 1e-6)
    v = x.shape[-1]
    k = v if top_k <= 0 else min(int(top_k), v)
    if k == v and top_p >= 1.0:
        return x
    if k < v:
        top_vals = jax.lax.top_k(x, k)[0]  # f32[R, k], descending
    else:
        top_vals = -jnp.sort(-x, axis=-1)  # descending
    threshold = top_vals[:, k - 1]
    if top_p < 1.0:
        probs = jax.nn.softmax(top_vals, axis=-1)  # renormalised over the top-k survivors, as transformers does
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < jnp.float32(top_p)  # the first token is always kept
        last = jnp.sum(keep.astype(jnp.int32), axis=-1) - 1
        threshold = jnp.take_along_axis(top_vals, last[:, None], axis=-1)[:, 0]
    return jnp.where(x >= threshold[:, None], x, NEG_INF)


def sample_tokens(
    logits: jax.Array, keys: jax.Array, temperature, top_k: int = 0, top_p: float = 1.0, suppress_ids: tuple = ()
):
    """One token per row: (tokens int32[R], logps f32[R], untempered). logits: f32[R, V]; keys: uint32[R, 2];
    temperature may be traced (0 = argmax); top_k / top_p / suppress_ids static.
    """
    logits = logits.astype(jnp.float32)
    temperature = jnp.asarray(temperature, jnp.float32)
    allowed = logits
    if suppress_ids:
        allowed = logits.at[:, jnp.asarray(suppress_ids, jnp.int32)].set(NEG_INF)

    def draw(_):
        filtered = filter_logits(allowed, temperature, top_k, top_p)
        return jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)

    greedy = jnp.argmax(allowed, axis=-1).astype(jnp.int32)
    if top_k > 0 or top_p < 1.0:  # the draw sorts the vocabulary: run it only when sampling
        tokens = jax.lax.cond(temperature > 0, draw, lambda _: greedy, None)
    else:  # an elementwise draw: computed and selected, no branch (on a GPU a branch is a host sync per token)
        tokens = jnp.where(temperature > 0, draw(None), greedy)
    logps = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
    return tokens, logps
