"""The generic training step every trainer's loop (``training.loop``) runs. With ``grad_accum_steps`` > 1 the
step scans micro-batches (a leading [A, ...] axis) for the exact weighted mean loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ipl_jax.training.state import TrainState, loss_params


def stack_microbatches(batches):
    """A list of A same-shaped batches -> one batch whose leaves have a leading [A, ...] axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


LossFn = Callable[[Any, Any, jax.Array], tuple[jax.Array, dict]]


def train_step_fn(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    schedule: optax.Schedule | None = None,
    grad_accum_steps: int = 1,
    weight_key: str | None = None,
    compute_dtype=None,
):
    """The un-jitted ``step(state, batch) -> (state, metrics)``: Σ wᵢ·lossᵢ / Σ wᵢ over micro-batches (w =
    ``metrics[weight_key]``); metrics: loss, grad_norm (before clipping), lr, weight, ``loss_fn``'s.
    """
    accum = int(grad_accum_steps)
    if accum < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {accum}")

    def weighted_loss(trainable, frozen, batch, rng):
        params = loss_params(trainable, frozen, compute_dtype)
        loss, metrics = loss_fn(params, batch, rng)
        loss = loss.astype(jnp.float32)
        weight = jnp.asarray(metrics[weight_key] if weight_key else 1.0, jnp.float32)
        weight = jax.lax.stop_gradient(weight)
        return loss * weight, (loss, weight, metrics)

    grad_fn = jax.grad(weighted_loss, has_aux=True)

    def step(state: TrainState, batch):
        rng, step_rng = jax.random.split(state.rng)
        if accum == 1:
            grads, (loss, weight, metrics) = grad_fn(state.params, state.frozen, batch, step_rng)
            total_w = weight
            mean_loss = loss
            mean_metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        else:
            rngs = jax.random.split(step_rng, accum)

            def micro(carry, xs):
                (g_sum,) = carry
                mb, r = xs
                g, (loss, weight, metrics) = grad_fn(state.params, state.frozen, mb, r)
                g_sum = jax.tree.map(jnp.add, g_sum, g)
                return (g_sum,), (loss, weight, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()})

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32 if _is_float(p) else p.dtype), state.params)
            (grads,), (losses, weights, metrics) = jax.lax.scan(micro, (zeros,), (batch, rngs))
            total_w = jnp.sum(weights)
            safe = jnp.where(total_w > 0, total_w, 1.0)
            mean_loss = jnp.sum(losses * weights) / safe
            mean_metrics = {k: jnp.sum(v * weights) / safe for k, v in metrics.items()}
        safe_w = jnp.where(total_w > 0, total_w, 1.0)
        grads = jax.tree.map(lambda g, p: (g / safe_w).astype(p.dtype), grads, state.params)
        with jax.named_scope("optimizer"):
            grad_norm = optax.tree.norm(grads)
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        out = dict(mean_metrics)
        out["loss"] = mean_loss
        out["grad_norm"] = grad_norm
        if weight_key:
            out[weight_key] = total_w
        if schedule is not None:
            out["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, rng=rng)
        return new_state, out

    return step


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)
