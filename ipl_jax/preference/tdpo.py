"""Iterative preference learning: reference log-probs, the T-DPO step, ``train_round`` and the round loop.

Data flow of one round (method.md §1, §6, §7)::

    sample CoaT-trees with π(n-1) ─► score leaves, back values up ─► α/β/γ classes, pairs ─► group by prefix
    ─► pack (``ipl_jax.preference.packing``) ─► reference log-probs with π(n-1) (once) ─► one epoch of T-DPO ─► π(n)
    ─► evaluate on dev ─► checkpoint

* ``TDPOConfig`` — a frozen (hashable) dataclass: model config, DPO settings (kind, β, λ_sft), the objective
  (``"tdpo"`` or ``"positive_sft"``: IPL without negatives), optimizer settings, remat / chunking.
* ``attach_reference(ref_params, batches, config)`` — reference log-probs of every pair, computed once per
  round by a separate jitted function under ``stop_gradient`` (never inside ``value_and_grad``), stored in the
  batches (``PackedBatch.ref_pos`` / ``ref_neg``).
* ``tdpo_step(state, batch, config)`` — one jitted update (state donated): packed forward, ``losses.tdpo_loss``
  (or ``positive_sft_loss``), gradient, optimizer update, built on ``train.make_train_step``.
* ``train_round(state, ref_params, round_data, rng, config)`` — pure: one epoch over the round's batches in an
  order drawn from ``rng``. Same inputs give the same outputs bit for bit on one device; under a ``mesh`` the
  batch rows are split over ('data', 'fsdp') and the params follow the model's partition rules.
* ``run_rounds(state, config, stages, rng)`` — the loop, with the sampler, the scorer and the dev evaluation
  passed in as functions (``RoundStages``), so the pipeline can wire the real ones and tests can inject fakes.

Baselines on the same core: naive full-trajectory DPO (``RoundConfig.pair_mode = "naive"``: the whole CoaT as
one continuation of the image + first prompt), IPL without negatives (``TDPOConfig.objective =
"positive_sft"``), and K ∈ {2, 3, 4} (the sampler's branching; ``PackingConfig.max_continuations`` >= K + 1).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from ipl_jax.preference import losses
from ipl_jax.preference import packing as packing_lib
from ipl_jax.preference import pairs as pairs_lib
from ipl_jax.training import train as train_lib
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.preference.packing import PackedBatch, PackingConfig

OBJECTIVES = ("tdpo", "positive_sft")
PAIR_MODES = ("tdpo", "naive")

_TRACES = {"tdpo_loss": 0, "reference": 0}


def trace_counts() -> dict:
    """How many times the T-DPO loss and the reference function have been traced (= compiled) so far."""
    return dict(_TRACES)


# ------------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class TDPOConfig:
    """Settings of the T-DPO step (hashable: the jitted step is cached per config).

    Paper values (method.md §7): IPL lr 1e-6..1e-7 in round 1, constant 1e-7 after; β = 0.1, λ_sft = 1.0.
    ``total_steps`` spans the cosine schedule when ``schedule == "cosine"`` (steps count across rounds).
    """

    model: Qwen2VLConfig
    dpo: losses.DPOConfig = losses.DPOConfig()
    objective: str = "tdpo"  # "tdpo" | "positive_sft" (IPL without negatives)
    learning_rate: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1000
    end_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    remat: bool = False  # rematerialise decoder layers in the backward pass
    logp_chunk: int = 128  # positions whose vocabulary logits are materialised at once
    compute_dtype: Optional[str] = None  # e.g. "bfloat16": params cast inside the step, master weights fp32

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"TDPOConfig.objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.dpo.kind not in losses.DPO_KINDS:
            raise ValueError(f"TDPOConfig.dpo.kind must be one of {losses.DPO_KINDS}, got {self.dpo.kind!r}")

    def optimizer_section(self) -> ml_collections.ConfigDict:
        """The ``optimizer`` section ``train.make_optimizer`` / ``make_schedule`` read."""
        c = train_lib.default_train_config().optimizer
        for key in ("learning_rate", "schedule", "warmup_steps", "total_steps", "end_lr_ratio", "weight_decay",
                    "grad_clip_norm", "b1", "b2", "eps"):
            c[key] = getattr(self, key)
        return c

    def optimizer(self):
        return train_lib.make_optimizer(self.optimizer_section())

    def schedule_fn(self):
        return train_lib.make_schedule(self.optimizer_section())


def init_state(params, config: TDPOConfig, rng, **kwargs) -> train_lib.TrainState:
    """A TrainState for ``config``'s optimizer; ``kwargs`` go to ``train.create_train_state`` (freeze_regex,
    lora, frozen_dtype)."""
    return train_lib.create_train_state(params, config.optimizer(), rng, **kwargs)


# ------------------------------------------------------------------------------------------------- the loss


def pair_terms(params: dict, cfg: Qwen2VLConfig, batch: PackedBatch, *, remat: bool = False, chunk: int = 128):
    """(chosen f32[P], rejected f32[P], chosen token count f32[P]) by the packed forward."""
    cont, ntok = packing_lib.continuation_logps(params, cfg, batch, remat=remat, chunk=chunk)
    return packing_lib.pair_logps(cont, ntok, batch)


def pair_loss(pos, neg, pos_tokens, batch: PackedBatch, config: TDPOConfig):
    """The objective on summed pair log-probs f32[P] (``pos_tokens``: the chosen continuation's scored token
    count): T-DPO (``losses.tdpo_loss`` with ``config.dpo``) or, for ``positive_sft``, the per-token NLL of the
    chosen continuations only. Returns (loss f32[], metrics)."""
    valid = batch.pair_valid
    if config.objective == "positive_sft":
        return losses.positive_sft_loss(pos, pos_tokens, valid)
    return losses.tdpo_loss(pos, neg, batch.ref_pos, batch.ref_neg, pos_tokens, valid, config.dpo)


def make_tdpo_loss(config: TDPOConfig):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` for ``train.make_train_step``; metrics include
    ``pairs`` (the step's weight)."""

    def loss_fn(params, batch: PackedBatch, rng):
        del rng  # no dropout in Qwen2-VL
        _TRACES["tdpo_loss"] += 1
        pos, neg, pos_tokens = pair_terms(params, config.model, batch, remat=config.remat, chunk=config.logp_chunk)
        return pair_loss(pos, neg, pos_tokens, batch, config)

    return loss_fn


# ------------------------------------------------------------------------------------------------- sharding


def batch_shardings(batch: PackedBatch, mesh):
    """PackedBatch of NamedShardings: rows (text and per-row image patches) over ('data', 'fsdp') when they
    divide; pairs replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    from ipl_jax.model.sharding import batch_spec

    rep = NamedSharding(mesh, PartitionSpec())
    rows = lambda x, axis=0: NamedSharding(mesh, batch_spec(mesh, np.shape(x), axis))  # noqa: E731
    return batch.replace(
        input_ids=rows(batch.input_ids), positions=rows(batch.positions, 1), segment_ids=rows(batch.segment_ids),
        target_ids=rows(batch.target_ids), score_slot=rows(batch.score_slot),
        vision=None if batch.vision is None else jax.tree.map(rows, batch.vision),
        pair_pos=rep, pair_neg=rep, pair_valid=rep, pair_turn=rep, ref_pos=rep, ref_neg=rep)


def state_shardings(state: train_lib.TrainState, optimizer, mesh) -> train_lib.TrainState:
    """TrainState shardings: params (and Adam moments) by the model's partition rules, the rest replicated."""
    from ipl_jax.training.lora import LoraParams, lora_shardings
    from ipl_jax.model.sharding import param_shardings

    frozen_sh = param_shardings(state.frozen, mesh) if state.frozen else {}
    if isinstance(state.params, LoraParams):
        params_sh = lora_shardings(state.params, frozen_sh)
    else:
        params_sh = param_shardings(state.params, mesh)
    return train_lib.train_state_shardings(state, optimizer, mesh, params_sh, frozen_sh)


def _tree_key(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x)))) for x in leaves)


# ------------------------------------------------------------------------------------------------- the step

_STEP_CACHE: dict = {}


def make_tdpo_step(config: TDPOConfig, *, mesh=None, state: Optional[train_lib.TrainState] = None,
                   batch: Optional[PackedBatch] = None):
    """The jitted ``step(state, batch) -> (state, metrics)`` (state donated). Under a ``mesh`` an example
    ``state`` and ``batch`` fix the shardings.

    metrics: loss, pref_loss, sft_nll, reward_margin, reward_accuracy, chosen_logratio, rejected_logratio
    (pair means), pairs (valid pairs), grad_norm, lr.
    """
    optimizer = config.optimizer()
    kwargs = dict(schedule=config.schedule_fn(), weight_key="pairs", compute_dtype=config.compute_dtype)
    if mesh is not None:
        if state is None or batch is None:
            raise ValueError("make_tdpo_step: a mesh needs an example state and batch")
        kwargs.update(mesh=mesh, state_shardings=state_shardings(state, optimizer, mesh),
                      batch_shardings=batch_shardings(batch, mesh))
    return train_lib.make_train_step(make_tdpo_loss(config), optimizer, **kwargs)


def _cached_step(config: TDPOConfig, mesh, state, batch):
    key = (config, mesh) if mesh is None else (config, mesh, _tree_key(state), _tree_key(batch))
    if key not in _STEP_CACHE:
        _STEP_CACHE[key] = make_tdpo_step(config, mesh=mesh, state=state, batch=batch)
    return _STEP_CACHE[key]


def tdpo_step(state: train_lib.TrainState, batch: PackedBatch, config: TDPOConfig, *, mesh=None):
    """One T-DPO update on a packed batch with reference log-probs attached; ``state`` is donated.

    Returns (new state, metrics dict of f32[] device scalars; see ``make_tdpo_step``)."""
    return _cached_step(config, mesh, state, batch)(state, batch)


# ------------------------------------------------------------------------------------------------- reference


def _reference_unjitted(params, batch: PackedBatch, cfg: Qwen2VLConfig, remat: bool, chunk: int):
    _TRACES["reference"] += 1
    params = jax.lax.stop_gradient(params)
    pos, neg, _ = pair_terms(params, cfg, batch, remat=remat, chunk=chunk)
    valid = batch.pair_valid
    return jnp.where(valid, pos, 0.0), jnp.where(valid, neg, 0.0)


_reference_jit = jax.jit(_reference_unjitted, static_argnums=(2, 3, 4))


def reference_logps(ref_params, batch: PackedBatch, config: TDPOConfig, *, mesh=None):
    """(ref_pos f32[P], ref_neg f32[P]): the frozen reference's summed log-probs of each pair's continuations
    (0 for padding pairs). Jitted once per batch shape; no gradient ever flows through it."""
    cfg = config.model
    if config.compute_dtype is not None:
        ref_params = train_lib.cast_floating(ref_params, config.compute_dtype)
    if mesh is None:
        return _reference_jit(ref_params, batch, cfg, False, config.logp_chunk)
    with jax.set_mesh(mesh):
        batch = jax.device_put(batch, batch_shardings(batch, mesh))
        return _reference_jit(ref_params, batch, cfg, False, config.logp_chunk)


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
        from ipl_jax.model.sharding import param_shardings

        ref_params = jax.device_put(ref_params, param_shardings(ref_params, mesh))
    out = []
    for batch in batches:
        ref_pos, ref_neg = reference_logps(ref_params, batch, config, mesh=mesh)
        out.append(batch.with_reference(np.asarray(ref_pos), np.asarray(ref_neg)))
    return RoundData(batches=out, has_reference=True)


# ------------------------------------------------------------------------------------------------- one round


def epoch_order(rng, n: int) -> np.ndarray:
    """A permutation of range(n) drawn from ``rng`` (raw uint32[2] key) on the host: no device program, so a
    round with a different number of batches compiles nothing."""
    seed = [int(x) for x in np.asarray(jax.device_get(rng), np.uint32).reshape(-1)]
    return np.random.default_rng(seed).permutation(n)


_MEAN_KEYS = ("loss", "pref_loss", "sft_nll", "reward_margin", "reward_accuracy", "chosen_logratio",
              "rejected_logratio")


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


def train_round(state: train_lib.TrainState, ref_params, round_data: RoundData, rng, config: TDPOConfig, *,
                mesh=None) -> tuple[train_lib.TrainState, dict]:
    """One epoch of T-DPO over the round's batches, in an order drawn from ``rng``.

    state: TrainState (donated step by step: do not reuse the passed-in state); ref_params: the frozen reference
    (the policy at the start of the round), used only when ``round_data`` has no reference log-probs yet — they
    are then computed before the first update, so ``ref_params`` may alias ``state``'s params; rng: raw
    uint32[2] key; mesh: optional, the state is placed on it by the model's partition rules.

    Returns (new state, metrics): the round means of ``summarize_steps`` plus ``per_step`` (list of dicts,
    in training order) and ``order`` (batch indices in training order).
    """
    if not round_data.has_reference:
        if ref_params is None:
            raise ValueError("train_round: round_data has no reference log-probs and ref_params is None")
        round_data = attach_reference(ref_params, round_data.batches, config, mesh=mesh)
    batches = round_data.batches
    order = epoch_order(rng, len(batches))
    if mesh is not None and batches:
        sh = state_shardings(state, config.optimizer(), mesh)
        state = jax.device_put(state, sh)
    device_metrics = []
    for i in order:
        state, m = tdpo_step(state, batches[i], config, mesh=mesh)
        device_metrics.append(m)
    per_step = [{k: float(v) for k, v in m.items()} for m in jax.device_get(device_metrics)]
    metrics = summarize_steps(per_step)
    metrics["per_step"] = per_step
    metrics["order"] = [int(i) for i in order]
    return state, metrics


# ------------------------------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class SampledTrees:
    """One batch of sampled CoaT-trees and what is needed to turn them into pairs.

    tree: ``tree.CoaTTree`` (B rows); steps: per row, the step's prompt segments (``sampling.prompts.StepPrompts``:
    prefix_ids, turn_prompt_ids for turns 2..4, pixel_values, image_grid_thw); golden_action_ids int32[B, Tg3]
    / golden_action_lengths int32[B]: the golden s3 text + ``<|im_end|>``; golden_grounding_ids int32[B, Tg4] /
    golden_grounding_lengths int32[B]: the golden s4 (any content for non-click goldens).
    """

    tree: Any
    steps: Sequence
    golden_action_ids: Any
    golden_action_lengths: Any
    golden_grounding_ids: Any
    golden_grounding_lengths: Any


@dataclasses.dataclass(frozen=True)
class TreeScores:
    """Scored trees (``ipl_jax.coat.rewards``: leaf rewards, then the value backup).

    node_values: 4 arrays f32[B, b1..bt] (level 4 = leaf values); leaf_types int32[B, b1, b2, b3, b4] and
    golden_types int32[B] (``pairs.action_type_id``); action_text_matches_golden: bool[B, b1, b2, b3] or None.
    """

    node_values: tuple
    leaf_types: Any
    golden_types: Any
    action_text_matches_golden: Any = None


@dataclasses.dataclass(frozen=True)
class RoundStages:
    """The pieces of a round that live in other modules, passed in as functions.

    sample(params, round_index, rng) -> iterable of SampledTrees (the round's training steps, with π(n-1));
    score(sampled) -> TreeScores; evaluate(params, round_index) -> mapping with at least ``step_accuracy``.
    """

    sample: Callable[[Any, int, jax.Array], Iterable[SampledTrees]]
    score: Callable[[SampledTrees], TreeScores]
    evaluate: Callable[[Any, int], Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class RoundConfig:
    """The round loop's settings.

    num_rounds: at most this many rounds (the paper: 4 on AITZ). patience: stop once dev step accuracy has not
    beaten the best so far (the seed policy included when ``evaluate_seed``) by more than ``min_improvement``
    for this many consecutive rounds [choice: 1]. pair_mode: "tdpo" (thinking-level pairs) or "naive"
    (whole-trajectory DPO baseline).
    """

    tdpo: TDPOConfig
    packing: PackingConfig = PackingConfig()
    pairs: pairs_lib.PairConfig = pairs_lib.PairConfig()
    pair_mode: str = "tdpo"
    num_rounds: int = 4
    patience: int = 1
    min_improvement: float = 0.0
    evaluate_seed: bool = True

    def __post_init__(self):
        if self.pair_mode not in PAIR_MODES:
            raise ValueError(f"RoundConfig.pair_mode must be one of {PAIR_MODES}, got {self.pair_mode!r}")
        if self.num_rounds < 1 or self.patience < 1:
            raise ValueError("RoundConfig: num_rounds and patience must be >= 1")


def round_pairs(sampled: SampledTrees, scores: TreeScores, config: RoundConfig, name: str = ""):
    """Pairs of one sampled batch, grouped by prefix. Returns (GroupedPairs, class counts int[3])."""
    tree = sampled.tree
    node_values = tuple(jnp.asarray(v, jnp.float32) for v in scores.node_values)
    step_valid = jnp.asarray(tree.step_valid, bool)
    classes = pairs_lib.classify_trees(node_values[-1], step_valid, config.pairs.one_tolerance)
    counts = np.asarray(pairs_lib.tree_class_counts(classes))
    if config.pair_mode == "naive":
        naive = pairs_lib.naive_dpo_pairs(node_values[-1], step_valid, config.pairs.one_tolerance)
        toks = pairs_lib.gather_naive_dpo_tokens(tree, naive)
        leaf_types = np.asarray(scores.leaf_types).reshape(tree.batch_size, -1)
        rows = np.arange(tree.batch_size)
        chosen = leaf_types[rows, np.asarray(naive.chosen_leaf)]
        rejected = leaf_types[rows, np.asarray(naive.rejected_leaf)]
        grounding = np.stack([np.isin(chosen, pairs_lib.CLICK_LIKE_TYPES),
                              np.isin(rejected, pairs_lib.CLICK_LIKE_TYPES)], axis=1)
        return packing_lib.naive_pair_groups(sampled.steps, toks, grounding, name), counts
    match = scores.action_text_matches_golden
    pb = pairs_lib.extract_pairs(node_values, jnp.asarray(scores.leaf_types, jnp.int32),
                                 jnp.asarray(scores.golden_types, jnp.int32), step_valid,
                                 step_index=jnp.asarray(tree.step_index, jnp.int32),
                                 action_text_matches_golden=None if match is None else jnp.asarray(match, bool),
                                 config=config.pairs)
    pt = pairs_lib.gather_pair_tokens(tree, pb, *(jnp.asarray(x, jnp.int32) for x in (
        sampled.golden_action_ids, sampled.golden_grounding_ids, sampled.golden_action_lengths,
        sampled.golden_grounding_lengths)))
    grouped = packing_lib.tree_pair_groups(sampled.steps, pt, name)
    grouped.skipped += int(pb.dropped)
    return grouped, counts


def _json_safe(d: Mapping) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out[k] = _json_safe(v)
        elif isinstance(v, (list, tuple)):
            out[k] = [float(x) if isinstance(x, (float, np.floating)) else x for x in v
                      if not isinstance(x, Mapping)]
        elif isinstance(v, (np.integer, int)) and not isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (np.floating, float)):
            out[k] = float(v)
        else:
            out[k] = v
    return out


def run_rounds(state: train_lib.TrainState, config: RoundConfig, stages: RoundStages, rng, *, mesh=None,
               checkpointer=None, log: Optional[Callable[[str], None]] = None):
    """The IPL round loop (method.md §1). Returns (final state, history: one dict per round).

    Round n (1-based): the reference is the policy at the round's start; sample trees on the training steps
    with it, score them, classify (α/β/γ), extract and group pairs, pack, compute reference log-probs once,
    run one epoch of T-DPO, evaluate on dev, checkpoint (``checkpointer.save(n, state, metadata=...)``,
    ``ipl_jax.training.checkpoint.Checkpointer``). A non-finite loss raises ``train.NonFiniteLossError`` before the
    round is checkpointed. Stops after ``num_rounds`` or when dev step accuracy stops improving
    (``patience``); the returned state is the last round's (each round's is in its checkpoint).

    A round dict holds: round, seconds (total and per phase), classes (``pairs.tree_class_shares``),
    pairs_by_turn ([whole-trajectory, turn 1..4]), pairs, skipped_pairs, groups, batches, train (round means of
    ``train_round``), dev (the evaluation), best_round.
    """
    emit = log or (lambda _: None)
    history: list[dict] = []
    best, best_round, stale = -math.inf, 0, 0
    if config.evaluate_seed:
        seed_dev = dict(stages.evaluate(train_lib.model_params(state.params, state.frozen), 0))
        best = float(seed_dev["step_accuracy"])
        history.append({"round": 0, "dev": _json_safe(seed_dev)})
        emit(f"round 0 (seed): dev step accuracy {best:.4f}")
    for n in range(1, config.num_rounds + 1):
        rng, sample_rng, train_rng = jax.random.split(jnp.asarray(rng), 3)
        t0 = time.perf_counter()
        policy = train_lib.model_params(state.params, state.frozen)  # π(n-1): sampler and frozen reference
        grouped = packing_lib.GroupedPairs()
        counts = np.zeros(3, np.int64)
        for i, sampled in enumerate(stages.sample(policy, n, sample_rng)):
            scores = stages.score(sampled)
            g, c = round_pairs(sampled, scores, config, name=f"round {n} batch {i} ")
            grouped.extend(g)
            counts += c
        t1 = time.perf_counter()
        batches = packing_lib.pack_round(config.tdpo.model, grouped.groups, grouped.pairs, config.packing)
        round_data = attach_reference(policy, batches, config.tdpo, mesh=mesh)
        t2 = time.perf_counter()
        record = {"round": n, "classes": pairs_lib.tree_class_shares(counts),
                  "pairs_by_turn": [int(x) for x in grouped.pairs_by_turn], "pairs": len(grouped.pairs),
                  "skipped_pairs": int(grouped.skipped), "groups": len(grouped.groups), "batches": len(batches)}
        if batches:
            state, train_metrics = train_round(state, None, round_data, train_rng, config.tdpo, mesh=mesh)
            for step_metrics in train_metrics["per_step"]:
                train_lib.check_finite(step_metrics, int(state.step))
            record["train"] = {k: v for k, v in train_metrics.items() if k not in ("per_step", "order")}
        else:
            record["train"] = {"steps": 0, "pairs": 0.0}
        del policy, round_data
        t3 = time.perf_counter()
        dev = dict(stages.evaluate(train_lib.model_params(state.params, state.frozen), n))
        t4 = time.perf_counter()
        acc = float(dev["step_accuracy"])
        if acc > best + config.min_improvement:
            best, best_round, stale = acc, n, 0
        else:
            stale += 1
        record.update(dev=dev, best_round=best_round,
                      seconds={"sample_score_pairs": t1 - t0, "pack_reference": t2 - t1, "train": t3 - t2,
                               "evaluate": t4 - t3, "total": t4 - t0})
        record = _json_safe(record)
        history.append(record)
        if checkpointer is not None:
            checkpointer.save(n, state, metadata={"ipl_round": record}, force=True)
        emit(f"round {n}: {record['pairs']} pairs, classes α {record['classes']['alpha']:.2f} "
             f"β {record['classes']['beta']:.2f} γ {record['classes']['gamma']:.2f}, "
             f"loss {record['train'].get('loss', float('nan')):.4f}, dev step accuracy {acc:.4f}, "
             f"{record['seconds']['total']:.1f}s")
        if stale >= config.patience:
            break
    if checkpointer is not None:
        checkpointer.wait()
    return state, history
