"""The generic training step and loop: ``train_step_fn(loss_fn, optimizer, ...)`` is the
``step(state, batch) -> (state, metrics)`` every trainer uses (warm-up SFT, T-DPO, the continued-SFT control),
``make_train_step`` its jitted form, and ``train_loop`` runs steps with the NaN guard and checkpoints.

``loss_fn(params, batch, rng) -> (loss, metrics)`` returns a mean loss; ``metrics[weight_key]`` (e.g. the number
of loss tokens) weights the micro-batches when accumulating. Gradient accumulation is a scan over micro-batches
inside the step (``grad_accum_steps = A > 1``: every batch leaf carries a leading micro-batch axis [A, ...], each
micro-batch a fixed-shape batch with its own padded image patches; ``stack_microbatches`` builds that from A
batches), so the loss is exactly the token-weighted mean over the whole batch.

``train_loop`` stops with ``NonFiniteLossError`` on a NaN/inf loss or gradient norm before any checkpoint is
written, and saves through ``checkpoint.Checkpointer``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax import distributed, fault_hook
from ipl_jax.training.state import TrainState, loss_params


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf loss or gradient norm; nothing from that step was checkpointed."""


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
    """The un-jitted ``step(state, batch) -> (state, metrics)`` (``make_train_step`` jits it; a trainer that
    keeps one module-level ``jax.jit`` keyed on static settings calls it inside its own traced function).

    ``loss_fn(params, batch, rng) -> (loss f32[], metrics dict of f32[])`` sees the full model params (trainable
    rejoined with frozen, cast to ``compute_dtype`` when given, LoRA adapters attached to be merged inside the
    layer scan: ``state.loss_params``; master weights stay fp32 and gradients come back in fp32).
    ``metrics[weight_key]`` (e.g. 'tokens') is the micro-batch's weight: the step's loss is Σ wᵢ·lossᵢ / Σ wᵢ over
    micro-batches (exactly the full-batch mean), other metrics are averaged with the same weights and the weight
    itself is summed. Without ``weight_key`` micro-batches weigh the same.

    Returned metrics: loss, grad_norm (before clipping), lr (of this update, when ``schedule`` is given), the
    weight, and every metric of ``loss_fn``.
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


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh=None,
    state_shardings: TrainState | None = None,
    batch_shardings=None,
    donate: bool = True,
    **step_options,
):
    """The jitted ``step(state, batch) -> (state, metrics)`` of ``train_step_fn(loss_fn, optimizer,
    **step_options)`` (schedule, grad_accum_steps, weight_key, compute_dtype).

    With ``mesh``, the step is jitted with ``state_shardings`` / ``batch_shardings`` in and out (metrics
    replicated) and traced under ``jax.set_mesh(mesh)``.
    """
    step = train_step_fn(loss_fn, optimizer, **step_options)
    donate_argnums = (0,) if donate else ()
    if mesh is None:
        return jax.jit(step, donate_argnums=donate_argnums)

    if state_shardings is None:
        raise ValueError("make_train_step: a mesh needs state_shardings (see train_state_shardings)")
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(
        step,
        in_shardings=(state_shardings, batch_shardings),
        out_shardings=(state_shardings, replicated),
        donate_argnums=donate_argnums,
    )

    def step_under_mesh(state, batch):
        with jax.set_mesh(mesh):
            return jitted(state, batch)

    step_under_mesh.jitted = jitted
    return step_under_mesh


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


# ------------------------------------------------------------------------------------------------ the loop


def check_finite(metrics: Mapping[str, Any], step: int) -> None:
    """Raise NonFiniteLossError if the loss or gradient norm of ``step`` is NaN/inf."""
    for key in ("loss", "grad_norm"):
        if key in metrics and not math.isfinite(float(metrics[key])):
            values = {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}
            raise NonFiniteLossError(
                f"step {step}: {key} is {float(metrics[key])} — training stopped before saving; "
                f"the last checkpoint is untouched. metrics: {values}"
            )


def train_loop(
    state: TrainState,
    step_fn,
    batches: Iterator,
    num_steps: int,
    *,
    checkpointer=None,
    data_state_fn: Callable[[], Any] | None = None,
    metadata_fn: Callable[[], Mapping[str, Any]] | None = None,
    on_metrics: Callable[[int, dict], None] | None = None,
) -> tuple[TrainState, list[dict]]:
    """Run ``step_fn`` until ``state.step == num_steps``; returns the final state and per-step host metrics.

    Every step's metrics are fetched and checked (NaN/inf raise ``NonFiniteLossError`` before anything is
    saved). With a ``checkpointer`` (``checkpoint.Checkpointer``) the state, ``data_state_fn()`` (the data
    iterator's state after the batches consumed so far) and ``metadata_fn()`` (JSON-able; called after
    ``on_metrics``, so it may carry what a resumed run needs to summarise the steps before it) are saved on its
    schedule and at the end. A restored ``state`` resumes from its own step.
    """
    history: list[dict] = []
    step = int(state.step)
    try:
        while step < num_steps:
            batch = next(batches)
            state, metrics = step_fn(state, batch)
            metrics = {k: np.asarray(v).item() for k, v in distributed.to_host(metrics).items()}
            step += 1
            check_finite(metrics, step)
            history.append(metrics)
            if on_metrics is not None:
                on_metrics(step, metrics)
            if checkpointer is not None:
                checkpointer.save(
                    step,
                    state,
                    data_state=data_state_fn() if data_state_fn else None,
                    metadata=metadata_fn() if metadata_fn else None,
                    force=step == num_steps,
                )
            fault_hook.kill_at("sft_step", step)
    finally:
        if checkpointer is not None:
            checkpointer.wait()
    return state, history
