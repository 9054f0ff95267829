"""Qwen3-VL-MoE's sparse MLP: a softmax router picks each token's top-k experts (their weights renormalised to sum
to 1), and the token's output is the weighted sum of those experts' SwiGLU MLPs.

Dense dispatch: every expert runs on every token and the outputs are combined with the routing weights (zero for
the experts not picked). Exact, and fixed shapes under ``jit`` with no capacity or dropped tokens; it costs
experts / top-k times the routed FLOPs. The expert dimension is an ordinary array axis, so the experts' weights
split over the mesh axis the sharding rules give it (``sharding.LOGICAL_AXES['expert']``) and GSPMD does the rest.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.model.config import TextConfig
from ipl_jax.model.layers import dense

TOKEN_CHUNK = 512  # positions of each row whose experts run at once (bounds the [B, chunk, E, 2I] intermediate)


def route(p: dict, t: TextConfig, h: jnp.ndarray) -> jnp.ndarray:
    """Routing weights dtype[..., E]: softmax of the router logits (in float32), the top ``num_experts_per_tok``
    kept and renormalised, the rest 0. p: {'kernel': [hidden, E]}; h: dtype[..., hidden]."""
    logits = dense(p, h, h.dtype)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, idx = jax.lax.top_k(probs, t.num_experts_per_tok)
    top = (top / jnp.sum(top, axis=-1, keepdims=True)).astype(h.dtype)
    picked = jax.nn.one_hot(idx, t.num_experts, dtype=h.dtype)  # [..., k, E]
    return jnp.einsum("...k,...ke->...e", top, picked)


def sparse_mlp(mp: dict, t: TextConfig, h: jnp.ndarray, chunk: int = TOKEN_CHUNK) -> jnp.ndarray:
    """The sparse MLP: h dtype[B, T, hidden] -> dtype[B, T, hidden], ``chunk`` positions of each row at a time (one
    rematerialised step of a ``lax.map``; T padded to a multiple): the experts' intermediate is [B, chunk, E, 2I].
    mp: {'gate': router, 'experts': {'gate_up_proj': [E, hidden, 2I] (gate columns first), 'down_proj':
    [E, I, hidden]}}."""
    b, t_len, hid = h.shape
    if t_len <= chunk:
        return _experts(mp, t, h)
    n = -(-t_len // chunk)
    parts = jnp.pad(h, ((0, 0), (0, n * chunk - t_len), (0, 0))).reshape(b, n, chunk, hid).swapaxes(0, 1)
    out = jax.lax.map(jax.checkpoint(lambda x: _experts(mp, t, x)), parts)  # [n, B, chunk, hidden]
    return out.swapaxes(0, 1).reshape(b, n * chunk, hid)[:, :t_len]


def _experts(mp: dict, t: TextConfig, h: jnp.ndarray) -> jnp.ndarray:
    """``sparse_mlp`` on a whole h dtype[B, c, hidden]."""
    dtype = h.dtype
    weights = route(mp["gate"], t, h)  # [B, c, E]
    ex = mp["experts"]
    gate_up = jnp.einsum("bth,ehf->btef", h, ex["gate_up_proj"].astype(dtype))
    gate, up = jnp.split(gate_up, 2, axis=-1)
    inner = jax.nn.silu(gate) * up * weights[..., None]  # [B, c, E, I]: unpicked experts contribute 0
    return jnp.einsum("btef,efh->bth", inner, ex["down_proj"].astype(dtype))
