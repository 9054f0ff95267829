"""What the RL learners share: parsing sampled completions into actions, per-row weights, reference log-probs,
seeds from keys, and round metric summaries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.actions import Action, needs_grounding, parse_action
from ipl_jax.rl import rewards as rewards_lib
from ipl_jax.rl.rows import Rows, frozen_token_logps
from ipl_jax.rl.sampling import Completion
from ipl_jax.sampling.tree_records import decode_turn
from ipl_jax.training import state as state_lib


def completion_texts(tokenizer, c: Completion) -> list[str]:
    """The decoded turn texts of a completion (end token removed)."""
    return [decode_turn(tokenizer, t, len(t)) for t in c.turns]


def parse_completion(tokenizer, c: Completion, style: str) -> tuple[Action, bool, bool]:
    """(action, format_ok, uses_grounding) of a completion; never raises."""
    texts = completion_texts(tokenizer, c)
    if style == "think_answer":
        action, ok = rewards_lib.parse_think_answer(texts[0])
        return action, ok, False
    action = parse_action(texts[2], texts[3])
    ok = rewards_lib.coat_format_ok(texts[2], texts[3], c.finished)
    return action, ok, needs_grounding(action)


def answer_length(c: Completion, uses_grounding: bool, style: str) -> int:
    """Generated tokens of the answer (the DAST length): every turn of the row, s4 only with grounding."""
    if style == "think_answer":
        return len(c.turns[0])
    return sum(len(t) for t in c.turns[: 4 if uses_grounding else 3])


def sequence_weights(rows: Rows, norm: str) -> jax.Array:
    """Per-token loss weights f32[R, T]: "token" (every generated token equal) or "sequence" (each completion sums
    to 1)."""
    mask = jnp.asarray(rows.target_mask, jnp.float32)
    if norm == "token":
        return mask
    if norm == "sequence":
        return mask / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
    raise ValueError(f"unknown length normalisation {norm!r}; expected 'token' or 'sequence'")


def reference_logps(ref_params, cfg, rows: Rows, chunk: int, compute_dtype: str | None) -> jax.Array:
    """The frozen reference's per-token log-probs f32[R, T] (its own jitted program, no gradient)."""
    if compute_dtype is not None:
        ref_params = state_lib.cast_floating(ref_params, compute_dtype)
    return frozen_token_logps(ref_params, cfg, rows, chunk)


def copy_params(params, dtype=None):
    """A copy of a parameter tree no donated step can invalidate, floating leaves in ``dtype`` (None: as they are)."""

    def leaf(x):
        to = dtype if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
        return jnp.array(x, dtype=to, copy=True)

    return jax.tree.map(leaf, params)


def policy_params(state: state_lib.TrainState, dtype=None):
    """The full parameter tree of a training state, floating leaves in ``dtype`` (None: as held). It may share
    buffers with ``state``: drop it before the next donating step."""
    params = state_lib.model_params(state.params, state.frozen)
    return params if dtype is None else state_lib.cast_floating(params, dtype)


def key_seed(rng) -> np.ndarray:
    """uint32[2] raw key data (the sampler's seed form) from a key."""
    key = jnp.asarray(rng)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.asarray(distributed.to_host(key), np.uint32).reshape(2)


def mean_metrics(per_step: Sequence[Mapping[str, float]], weight_key: str) -> dict:
    """Weighted means (by ``weight_key``) of per-step metrics over the steps reporting each, the weight sum, the
    count."""
    out = {"steps": len(per_step), weight_key: float(sum(m.get(weight_key, 0.0) for m in per_step))}
    keys = sorted({k for m in per_step for k in m} - {weight_key})
    for key in keys:
        have = [m for m in per_step if key in m]
        vals = np.asarray([m[key] for m in have], np.float64)
        w = np.asarray([m.get(weight_key, 1.0) for m in have], np.float64)
        out[key] = float(np.sum(vals * w) / np.sum(w)) if np.sum(w) > 0 else float(np.mean(vals))
    return out
