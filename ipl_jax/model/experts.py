"""Qwen3-VL-MoE's sparse MLP: a softmax router picks each token's top-k experts (their weights renormalised to sum
to 1), and the token's output is the weighted sum of those experts' SwiGLU MLPs.

Three dispatches, all exact (no capacity, no dropped tokens) and of fixed shapes under ``jit``
(``Qwen2VLConfig.moe_dispatch``):

- ``dense``: every expert runs on every token, combined with the routing weights (0 for the experts not picked):
  experts / top-k times the routed FLOPs.
- ``grouped``: each row's T * k (token, expert) assignments are sorted by expert, their token rows gathered into
  blocks of ``block`` rows that each belong to one expert (each expert's group padded to whole blocks, at most
  T * k + E * (block - 1) rows), every block multiplied by its expert's weights (one batched matmul per
  projection), and the weighted outputs scatter-added back to their tokens: at most twice the routed FLOPs, on
  any backend. The block's expert weights are gathered from the stacked [E, ...] weights, so a mesh that splits
  the experts over 'fsdp' all-gathers them for the layer first (the FSDP way every other weight is used).
- ``ragged``: the same sorted rows through ``jax.lax.ragged_dot`` (group sizes = tokens per expert), no padding.
  Native on TPU; XLA:GPU and XLA:CPU rewrite it into a masked dense matmul over all experts (E times the rows),
  so ``auto`` picks it on TPU only, ``grouped`` elsewhere.

Rows too short for the groups to fill blocks (under ``MIN_MEAN_GROUP`` assignments per expert: the decode steps)
run the dense dispatch whatever the setting.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.model.config import TextConfig
from ipl_jax.model.layers import dense

DISPATCHES = ("auto", "dense", "grouped", "ragged")
# positions of each row whose experts run at once: bounds the dense [B, chunk, E, 2I] intermediate, and the
# grouped dispatch's gathered block weights [B, blocks, hidden, 2I]
TOKEN_CHUNK = {"dense": 512, "grouped": 4096, "ragged": 4096}
# rows whose mean group (assignments per expert) is under this run the dense dispatch: a one-token decode step
# would pad every expert's group to a block, more work than every expert on that token
MIN_MEAN_GROUP = 8
MAX_BLOCK = 256  # rows of a grouped block, at most (smaller when the mean group is smaller: less padding)


def resolve_dispatch(name: str, platform: str | None = None) -> str:
    """The dispatch that runs for the setting ``name`` on ``platform`` (default: JAX's backend): 'auto' is
    'ragged' on TPU, else 'grouped'."""
    if name not in DISPATCHES:
        raise ValueError(f"model.moe_dispatch={name!r} is unknown (valid: {', '.join(DISPATCHES)})")
    if name != "auto":
        return name
    return "ragged" if (platform or jax.default_backend()) == "tpu" else "grouped"


def top_k(p: dict, t: TextConfig, h: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Each token's experts: (weights dtype[..., k], renormalised softmax of the router logits (in float32),
    indices int32[..., k]). p: {'kernel': [hidden, E]}; h: dtype[..., hidden]."""
    logits = dense(p, h, h.dtype)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, idx = jax.lax.top_k(probs, t.num_experts_per_tok)
    return (top / jnp.sum(top, axis=-1, keepdims=True)).astype(h.dtype), idx


def route(p: dict, t: TextConfig, h: jnp.ndarray) -> jnp.ndarray:
    """Routing weights dtype[..., E]: ``top_k``'s weights at their experts, 0 elsewhere."""
    top, idx = top_k(p, t, h)
    picked = jax.nn.one_hot(idx, t.num_experts, dtype=h.dtype)  # [..., k, E]
    return jnp.einsum("...k,...ke->...e", top, picked)


def sparse_mlp(
    mp: dict, t: TextConfig, h: jnp.ndarray, dispatch: str = "auto", chunk: int | None = None
) -> jnp.ndarray:
    """The sparse MLP: h dtype[B, T, hidden] -> dtype[B, T, hidden], ``chunk`` positions of each row at a time (one
    rematerialised step of a ``lax.map``; T padded to a multiple; default ``TOKEN_CHUNK`` of the dispatch).
    mp: {'gate': router, 'experts': {'gate_up_proj': [E, hidden, 2I] (gate columns first), 'down_proj':
    [E, I, hidden]}}."""
    dispatch = resolve_dispatch(dispatch)
    chunk = TOKEN_CHUNK[dispatch] if chunk is None else chunk
    if min(chunk, h.shape[1]) * t.num_experts_per_tok < MIN_MEAN_GROUP * t.num_experts:
        dispatch, chunk = "dense", min(chunk, TOKEN_CHUNK["dense"])  # short rows (decoding): groups too small
    run = _dense if dispatch == "dense" else (lambda mp, t, x: _grouped(mp, t, x, dispatch == "ragged"))
    b, t_len, hid = h.shape
    if t_len <= chunk:
        return run(mp, t, h)
    n = -(-t_len // chunk)
    parts = jnp.pad(h, ((0, 0), (0, n * chunk - t_len), (0, 0))).reshape(b, n, chunk, hid).swapaxes(0, 1)
    out = jax.lax.map(jax.checkpoint(lambda x: run(mp, t, x)), parts)  # [n, B, chunk, hidden]
    return out.swapaxes(0, 1).reshape(b, n * chunk, hid)[:, :t_len]


def _dense(mp: dict, t: TextConfig, h: jnp.ndarray) -> jnp.ndarray:
    """The dense dispatch on a whole h dtype[B, c, hidden]."""
    dtype = h.dtype
    weights = route(mp["gate"], t, h)  # [B, c, E]
    ex = mp["experts"]
    gate_up = jnp.einsum("bth,ehf->btef", h, ex["gate_up_proj"].astype(dtype))
    gate, up = jnp.split(gate_up, 2, axis=-1)
    inner = jax.nn.silu(gate) * up * weights[..., None]  # [B, c, E, I]: unpicked experts contribute 0
    return jnp.einsum("btef,efh->bth", inner, ex["down_proj"].astype(dtype))


def _gathered(w: jnp.ndarray, spec: tuple) -> jnp.ndarray:
    """w with its expert axis whole on every device (the ambient mesh's other axes in ``spec`` kept where they
    divide), so that indexing it by expert reads local memory."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return w
    sizes = dict(mesh.shape)
    kept = tuple(a if a in sizes and w.shape[i] % sizes[a] == 0 else None for i, a in enumerate(spec))
    return jax.lax.with_sharding_constraint(w, jax.sharding.PartitionSpec(*kept))


def _grouped(mp: dict, t: TextConfig, h: jnp.ndarray, ragged: bool) -> jnp.ndarray:
    """The grouped (``ragged``: ragged_dot) dispatch on a whole h dtype[B, c, hidden], each row sorted on its own
    (the rows stay split over the mesh's batch axes)."""
    ex = mp["experts"]
    gate_up = _gathered(ex["gate_up_proj"].astype(h.dtype), (None, None, "tensor"))
    down = _gathered(ex["down_proj"].astype(h.dtype), (None, "tensor", None))
    top, idx = top_k(mp["gate"], t, h)  # [B, c, k]
    if ragged:  # ragged_dot has no batching rule for these operands: one row after another
        return jax.lax.map(lambda a: _ragged_row(*a, gate_up, down, t.num_experts), (h, top, idx))
    return jax.vmap(lambda x, w, i: _blocked_row(x, w, i, gate_up, down, t.num_experts))(h, top, idx)


def _sorted_assignments(idx: jnp.ndarray, num_experts: int):
    """idx int32[N, k] -> (order [N*k]: the assignments (token * k + slot) sorted by expert, their experts
    [N*k], tokens per expert int32[E], first sorted position of each expert [E])."""
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, flat[order], sizes, jnp.cumsum(sizes) - sizes


def _combine(y: jnp.ndarray, w: jnp.ndarray, order: jnp.ndarray, n: int) -> jnp.ndarray:
    """Each sorted assignment's output y [N*k, hidden] times its routing weight (w [N, k]), summed per token."""
    k = w.shape[1]
    return jax.ops.segment_sum(y * w.reshape(-1)[order][:, None], order // k, num_segments=n)


def _swiglu(gate_up: jnp.ndarray) -> jnp.ndarray:
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return jax.nn.silu(gate) * up


def _ragged_row(x, w, idx, gate_up, down, num_experts):
    """One row x [N, hidden] through ``jax.lax.ragged_dot`` on its assignments sorted by expert."""
    n, k = idx.shape
    order, _, sizes, _ = _sorted_assignments(idx, num_experts)
    rows = x[order // k]  # [N*k, hidden]
    inner = _swiglu(jax.lax.ragged_dot(rows, gate_up, sizes))
    return _combine(jax.lax.ragged_dot(inner, down, sizes), w, order, n)


def block_rows(assignments: int, num_experts: int) -> int:
    """Rows of a grouped block: the largest power of two <= the mean group (assignments / experts), 8 at least
    and ``MAX_BLOCK`` at most, so the padding (< one block per expert) stays under the rows themselves."""
    mean = max(assignments // num_experts, 8)
    return min(1 << (mean.bit_length() - 1), MAX_BLOCK)


def _blocked_row(x, w, idx, gate_up, down, num_experts):
    """One row x [N, hidden] through whole-block matmuls: each expert's sorted assignments padded to a multiple of
    ``block_rows``, every block multiplied by its own expert's (gathered) weights."""
    n, k = idx.shape
    blk = block_rows(n * k, num_experts)
    n_blocks = -(-(n * k + num_experts * (blk - 1)) // blk)
    order, expert, sizes, start = _sorted_assignments(idx, num_experts)
    padded = -(-sizes // blk) * blk
    padded_end = jnp.cumsum(padded)
    dest = (padded_end - padded)[expert] + jnp.arange(n * k, dtype=jnp.int32) - start[expert]  # [N*k] unique
    rows = jnp.zeros((n_blocks * blk, x.shape[1]), x.dtype).at[dest].set(x[order // k], unique_indices=True)
    # a block's expert: the group its first row falls in (blocks past the last group hold zeros; any expert)
    owner = jnp.minimum(jnp.searchsorted(padded_end, jnp.arange(n_blocks) * blk, side="right"), num_experts - 1)
    rows = rows.reshape(n_blocks, blk, -1)
    inner = _swiglu(jnp.einsum("bth,bhf->btf", rows, gate_up[owner]))
    y = jnp.einsum("btf,bfh->bth", inner, down[owner]).reshape(n_blocks * blk, -1)
    return _combine(y[dest], w, order, n)
