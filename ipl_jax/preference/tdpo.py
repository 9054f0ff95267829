"""T-DPO: reference log-probs (computed once per round, never inside the gradient), the jitted T-DPO step and
``train_round``, one epoch in an order drawn from the round's key (docs/method.md §7).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax import distributed
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.sharding import batch_spec, param_shardings
from ipl_jax.preference import losses
from ipl_jax.preference import packing as packing_lib
from ipl_jax.preference.packed_batch import PackedBatch
from ipl_jax.progress import progress
from ipl_jax.training import optimizer as optimizer_lib
from ipl_jax.training import state as state_lib
from ipl_jax.training import step as step_lib
from ipl_jax.training.loop import TrainLoop, place_state

OBJECTIVES = ("tdpo", "positive_sft")

# ------------------------------------------------------------------------------------------------- config


# The T-DPO defaults (paper round 1, docs/method.md §7): a constant 1e-6 after no warm-up, clipping at 1.
IPL_OPTIMIZER = optimizer_lib.OptimizerSettings(learning_rate=1e-6, schedule="constant", total_steps=1000)


@dataclasses.dataclass(frozen=True)
class TDPOConfig:
    """Settings of the T-DPO step (hashable): the model, the loss, the objective, the optimizer, precision."""

    model: Qwen2VLConfig
    dpo: losses.DPOSettings = losses.DPOSettings()
    objective: str = "tdpo"  # "tdpo" | "positive_sft" (IPL without negatives)
    optimizer_settings: optimizer_lib.OptimizerSettings = IPL_OPTIMIZER
    remat: bool | str = False  # rematerialisation policy (model.layers.REMAT_POLICIES; True = "full")
    logp_chunk: int = 128  # positions whose vocabulary logits are materialised at once
    compute_dtype: str | None = None  # e.g. "bfloat16": params cast inside the step, master weights fp32
    reference_dtype: str | None = None  # storage of the frozen reference's weights (None: the compute dtype)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"TDPOConfig.objective must be one of {OBJECTIVES}, got {self.objective!r}")

    def optimizer(self):
        """The optax transformation of ``optimizer_settings``."""
        return optimizer_lib.make_optimizer(self.optimizer_settings)

    def schedule_fn(self):
        return optimizer_lib.make_schedule(self.optimizer_settings)


def round_schedule(config: TDPOConfig, n_updates: int) -> TDPOConfig:
    """``config`` with a cosine schedule spanning a round's ``n_updates`` (a constant schedule is left as is)."""
    if config.optimizer_settings.schedule == "constant":
        return config
    settings = dataclasses.replace(config.optimizer_settings, total_steps=max(1, int(n_updates)))
    return dataclasses.replace(config, optimizer_settings=settings)


def init_state(params, config: TDPOConfig, rng, **kwargs) -> state_lib.TrainState:
    """A TrainState for ``config``'s optimizer; ``kwargs`` go to ``training.state.create_train_state``."""
    return state_lib.create_train_state(params, config.optimizer(), rng, **kwargs)


# ------------------------------------------------------------------------------------------------- the loss


def pair_terms(params: dict, cfg: Qwen2VLConfig, batch: PackedBatch, *, remat: bool | str = False, chunk: int = 128):
    """(chosen f32[P], rejected f32[P], chosen token count f32[P]) by the packed forward."""
    cont, ntok = packing_lib.continuation_logps(params, cfg, batch, remat=remat, chunk=chunk)
    return packing_lib.pair_logps(cont, ntok, batch)


def pair_loss(pos, neg, pos_tokens, batch: PackedBatch, config: TDPOConfig):
    """The objective on summed pair log-probs f32[P]: ``losses.tdpo_loss`` or, for ``positive_sft``, the chosen
    continuations' per-token NLL. Returns (loss f32[], metrics)."""
    valid = batch.pair_valid
    if config.objective == "positive_sft":
        return losses.positive_sft_loss(pos, pos_tokens, valid, config.dpo.sft_norm)
    return losses.tdpo_loss(pos, neg, batch.ref_pos, batch.ref_neg, pos_tokens, valid, config.dpo)


def make_tdpo_loss(config: TDPOConfig):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` for ``training.step.train_step_fn`` (metrics: ``pairs``)."""

    def loss_fn(params, batch: PackedBatch, rng):
        del rng  # no dropout in Qwen2-VL
        pos, neg, pos_tokens = pair_terms(params, config.model, batch, remat=config.remat, chunk=config.logp_chunk)
        return pair_loss(pos, neg, pos_tokens, batch, config)

    return loss_fn


# ------------------------------------------------------------------------------------------------- sharding


def batch_shardings(batch: PackedBatch, mesh):
    """PackedBatch of NamedShardings: rows over ('data', 'fsdp') when they divide; pairs replicated."""
    rep = NamedSharding(mesh, PartitionSpec())
    rows = lambda x, axis=0: NamedSharding(mesh, batch_spec(mesh, np.shape(x), axis))
    if batch.vision is not None and batch.vision.patches.shape[0] != batch.rows:  # a process's rows: global shapes
        whole = lambda x: jax.ShapeDtypeStruct((batch.rows, *x.shape[1:]), x.dtype)
        batch = batch.replace(vision=jax.tree.map(whole, batch.vision))
    return batch.replace(
        input_ids=rows(batch.input_ids),
        positions=rows(batch.positions, 1),
        segment_ids=rows(batch.segment_ids),
        target_ids=rows(batch.target_ids),
        score_slot=rows(batch.score_slot),
        vision=None if batch.vision is None else jax.tree.map(rows, batch.vision),
        pair_pos=rep,
        pair_neg=rep,
        pair_valid=rep,
        pair_turn=rep,
        ref_pos=rep,
        ref_neg=rep,
    )


def place_batch(batch: PackedBatch, mesh) -> PackedBatch:
    """A packed batch as global arrays with ``batch_shardings`` (vision leaves from this process's rows)."""
    sh = batch_shardings(batch, mesh)
    if batch.vision is None or batch.vision.patches.shape[0] == batch.rows:
        return distributed.put(batch, sh)
    rows = distributed.batch_rows(batch.rows, mesh)
    vision = distributed.from_local_rows(
        batch.vision, sh.vision, jax.tree.map(lambda _: 0, batch.vision), rows, batch.rows
    )
    placed = distributed.put(batch.replace(vision=None), sh.replace(vision=None))
    return placed.replace(vision=vision)


# ------------------------------------------------------------------------------------------------- the step


def _tdpo_update(state: state_lib.TrainState, batch: PackedBatch, config: TDPOConfig, mesh):
    """One update weighted by its valid pairs; under a mesh, rows and the new state are pinned to their shardings."""
    optimizer = config.optimizer()
    if mesh is not None:
        batch = jax.lax.with_sharding_constraint(batch, batch_shardings(batch, mesh))
    step = step_lib.train_step_fn(
        make_tdpo_loss(config),
        optimizer,
        schedule=config.schedule_fn(),
        weight_key="pairs",
        compute_dtype=config.compute_dtype,
    )
    new_state, metrics = step(state, batch)
    if mesh is not None:
        new_state = jax.lax.with_sharding_constraint(new_state, state_lib.state_shardings(state, optimizer, mesh))
    return new_state, metrics


# The one program of a T-DPO step: jax.jit's own cache (keyed on the hashable config, the mesh and the input
# shapes) holds its compiled forms. metrics: loss, pref_loss, sft_nll, reward_margin, reward_accuracy,
# chosen_logratio, rejected_logratio (pair means), pairs (valid pairs), grad_norm, lr.
tdpo_update = jax.jit(_tdpo_update, static_argnums=(2, 3), donate_argnums=(0,))


def tdpo_step(state: state_lib.TrainState, batch: PackedBatch, config: TDPOConfig, *, mesh=None):
    """One T-DPO update on a packed batch with reference log-probs attached; ``state`` is donated.
    Returns (new state, metrics of f32[] device scalars)."""
    if mesh is None:
        return tdpo_update(state, batch, config, None)
    batch = place_batch(batch, mesh)
    with jax.set_mesh(mesh):
        return tdpo_update(state, batch, config, mesh)


def lower_tdpo_step(state, batch: PackedBatch, config: TDPOConfig, mesh=None) -> jax.stages.Lowered:
    """``tdpo_update`` lowered for ``state`` / ``batch`` (arrays or ``ShapeDtypeStruct`` s with the shardings
    ``tdpo_step`` uses), for ahead-of-time memory and FLOP figures."""
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        return tdpo_update.lower(state, batch, config, mesh)


# ------------------------------------------------------------------------------------------------- reference


def _reference_unjitted(params, batch: PackedBatch, cfg: Qwen2VLConfig, remat: bool, chunk: int):
    params = jax.lax.stop_gradient(params)
    pos, neg, _ = pair_terms(params, cfg, batch, remat=remat, chunk=chunk)
    valid = batch.pair_valid
    return jnp.where(valid, pos, 0.0), jnp.where(valid, neg, 0.0)


reference_jit = jax.jit(_reference_unjitted, static_argnums=(2, 3, 4))


def reference_logps(ref_params, batch: PackedBatch, config: TDPOConfig, *, mesh=None):
    """(ref_pos f32[P], ref_neg f32[P]): the frozen reference's summed log-probs of each pair (0 for padding pairs)."""
    cfg = config.model
    stored = config.reference_dtype or config.compute_dtype
    if stored is not None:
        ref_params = state_lib.cast_floating(ref_params, stored)
    if mesh is None:
        return reference_jit(ref_params, batch, cfg, False, config.logp_chunk)
    with jax.set_mesh(mesh):
        batch = place_batch(batch, mesh)
        return reference_jit(ref_params, batch, cfg, False, config.logp_chunk)


@dataclasses.dataclass
class RoundData:
    """The packed batches of one round. ``has_reference``: their ``ref_pos`` / ``ref_neg`` are filled."""

    batches: list
    has_reference: bool = False

    @property
    def num_pairs(self) -> int:
        return sum(b.num_pairs for b in self.batches)


def attach_reference(ref_params, batches: Sequence[PackedBatch], config: TDPOConfig, *, mesh=None) -> RoundData:
    """Reference log-probs of every batch, computed once, stored in the batches (host numpy)."""
    if mesh is not None:
        ref_params = jax.device_put(ref_params, param_shardings(ref_params, mesh))
    else:  # committed, whether fresh or a trained state's: one program for every round
        ref_params = distributed.on_first_device(ref_params)
    out = []
    for batch in progress(batches, desc="reference log-probs", unit="batch"):
        ref_pos, ref_neg = reference_logps(ref_params, batch, config, mesh=mesh)
        ref_pos, ref_neg = distributed.to_host((ref_pos, ref_neg))
        out.append(batch.with_reference(ref_pos, ref_neg))
    return RoundData(batches=out, has_reference=True)


# ------------------------------------------------------------------------------------------------- one round


def epoch_order(rng, n: int) -> np.ndarray:
    """A permutation of range(n) drawn from ``rng`` (raw uint32[2] key) on the host."""
    seed = [int(x) for x in np.asarray(distributed.to_host(rng), np.uint32).reshape(-1)]
    return np.random.default_rng(seed).permutation(n)


_MEAN_KEYS = (
    "loss",
    "pref_loss",
    "sft_nll",
    "reward_margin",
    "reward_accuracy",
    "chosen_logratio",
    "rejected_logratio",
)


def summarize_steps(per_step: Sequence[Mapping[str, float]]) -> dict:
    """Round metrics from per-step metrics: pair-weighted means of the loss terms, mean grad norm, sums."""
    pairs = np.asarray([m.get("pairs", 0.0) for m in per_step], np.float64)
    total = float(pairs.sum())
    out = {"steps": len(per_step), "pairs": total}
    for key in _MEAN_KEYS:
        if per_step and key in per_step[0]:
            vals = np.asarray([m[key] for m in per_step], np.float64)
            out[key] = float(np.sum(vals * pairs) / total) if total > 0 else float("nan")
    if per_step and "grad_norm" in per_step[0]:
        out["grad_norm"] = float(np.mean([m["grad_norm"] for m in per_step]))
    return out


def train_round(
    state: state_lib.TrainState, ref_params, round_data: RoundData, rng, config: TDPOConfig, *, mesh=None
) -> tuple[state_lib.TrainState, dict]:
    """One epoch of T-DPO over the round's batches in an order drawn from ``rng``; ``state`` is donated.
    ``ref_params`` is used only when reference log-probs are missing (then computed first). Returns (state,
    metrics with ``per_step`` and ``order``); no batches: the state as given and no steps.
    """
    if not round_data.batches:
        return state, {"steps": 0, "pairs": 0.0, "per_step": []}
    config = round_schedule(config, len(round_data.batches))
    if not round_data.has_reference:
        if ref_params is None:
            raise ValueError("train_round: round_data has no reference log-probs and ref_params is None")
        round_data = attach_reference(ref_params, round_data.batches, config, mesh=mesh)
    batches = round_data.batches
    order = epoch_order(rng, len(batches))
    t0 = time.perf_counter()
    finished: list[float] = []  # seconds since t0 as each step's metrics arrive

    def on_metrics(step: int, metrics: dict) -> None:
        finished.append(time.perf_counter() - t0)

    loop = TrainLoop(
        lambda st, batch: tdpo_step(st, batch, config, mesh=mesh),
        kill_point="tdpo_step",
        desc="T-DPO",
        place=functools.partial(place_state, optimizer=config.optimizer(), mesh=mesh),
        in_flight=True,  # the bar counts finished steps, so its ETA is the device's
        on_metrics=on_metrics,
    )
    state, per_step = loop.run(state, (batches[i] for i in order), total=len(order))
    seconds = time.perf_counter() - t0
    metrics = summarize_steps(per_step)
    tokens = [batch_tokens(batches[i]) for i in order]
    # throughput: every trained (non-padding) token; wall times of the loop and of its first step (compile included)
    metrics.update(tokens=float(sum(tokens)), first_step_tokens=float(tokens[0]))
    metrics.update(seconds=seconds, first_step_seconds=finished[0] if len(finished) > 1 else seconds)
    metrics["per_step"] = per_step
    metrics["order"] = [int(i) for i in order]
    return state, metrics


def batch_tokens(batch: PackedBatch) -> int:
    """The non-padding tokens of a packed batch."""
    return int(np.sum(np.asarray(batch.segment_ids) >= 0))
