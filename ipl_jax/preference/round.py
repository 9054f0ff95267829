"""One IPL round (docs/method.md §1, §6, §7), π(n-1) -> π(n): sample, score, pair, group, select, pack, attach
reference log-probs once, one epoch of T-DPO. The sampler and scorer are passed in (``RoundStages``), and so is
the update of a control that trains on something else.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.actions import ACTION_TYPES
from ipl_jax.preference import diagnostics as diagnostics_lib
from ipl_jax.preference import grouping, pair_tokens
from ipl_jax.preference import packing as packing_lib
from ipl_jax.preference import pairs as pairs_lib
from ipl_jax.preference.packed_batch import PackingConfig
from ipl_jax.preference.sections import PairSelection
from ipl_jax.preference.selection import select_round_pairs
from ipl_jax.preference.tdpo import RoundData, TDPOConfig, attach_reference, train_round
from ipl_jax.training import state as state_lib

PAIR_MODES = ("tdpo", "naive")
TRAIN_ON = ("pairs", "golden")


@dataclasses.dataclass(frozen=True)
class SampledTrees:
    """One batch of sampled CoaT-trees: tree (B rows), steps (``StepPrompts``), golden s3 / s4 ids int32[B, Tg] with
    lengths int32[B].
    """

    tree: Any
    steps: Sequence
    golden_action_ids: Any
    golden_action_lengths: Any
    golden_grounding_ids: Any
    golden_grounding_lengths: Any


@dataclasses.dataclass(frozen=True)
class TreeScores:
    """Scored trees: node_values, leaf_types, golden_types, and optional action_text_matches_golden /
    thought_names_golden (as ``pairs.extract_pairs`` reads them).
    """

    node_values: tuple
    leaf_types: Any
    golden_types: Any
    action_text_matches_golden: Any = None
    thought_names_golden: Any = None


@dataclasses.dataclass(frozen=True)
class RoundProbe:
    """Diagnostics around a round's update: ``heldout(params, rng)`` trees on held-out steps, ``before(params)`` on
    π(n-1), ``after(params, context)`` -> dict merged into ``diagnostics``.
    """

    heldout: Callable[[Any, jax.Array], Iterable[tuple[SampledTrees, TreeScores]]] | None = None
    before: Callable[[Any], Any] | None = None
    after: Callable[[Any, Any], dict] | None = None


@dataclasses.dataclass(frozen=True)
class RoundStages:
    """The pieces of a round passed in: sample, score, probe (or None) and the update ``update(state, round_data,
    rng) -> (state, metrics)`` (None: one epoch of T-DPO on the round's pairs, ``tdpo.train_round``).
    ``update_reads_reference``: whether the update reads the pairs' reference log-probs (the golden-SFT controls'
    does not; the probe's diagnostics always do)."""

    sample: Callable[[Any, int, jax.Array], Iterable[SampledTrees]]
    score: Callable[[SampledTrees], TreeScores]
    update: Callable[[Any, RoundData, jax.Array], tuple] | None = None
    update_reads_reference: bool = True
    probe: RoundProbe | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundConfig:
    """One round's settings: pair_mode "tdpo" | "naive"; the pair selection (``PairSelection``: dedup, type_balance,
    mix_trees); train_on "pairs" | "golden" (the round driver passes the golden-SFT update for "golden");
    gamma_consistent_only: action-turn γ pairs only below thoughts naming the golden action.
    """

    tdpo: TDPOConfig
    packing: PackingConfig = PackingConfig()
    pairs: pairs_lib.PairConfig = pairs_lib.PairConfig()
    selection: PairSelection = PairSelection()
    pair_mode: str = "tdpo"
    train_on: str = "pairs"
    gamma_consistent_only: bool = False

    def __post_init__(self):
        if self.pair_mode not in PAIR_MODES:
            raise ValueError(f"RoundConfig.pair_mode must be one of {PAIR_MODES}, got {self.pair_mode!r}")
        if self.train_on not in TRAIN_ON:
            raise ValueError(f"RoundConfig.train_on must be one of {TRAIN_ON}, got {self.train_on!r}")


def round_pairs(sampled: SampledTrees, scores: TreeScores, config: RoundConfig, name: str = ""):
    """Pairs of one sampled batch, grouped by prefix. Returns (GroupedPairs, class counts int[3])."""
    tree = sampled.tree
    node_values = tuple(jnp.asarray(v, jnp.float32) for v in scores.node_values)
    step_valid = jnp.asarray(tree.step_valid, bool)
    classes = pairs_lib.classify_trees(node_values[-1], step_valid, config.pairs.one_tolerance)
    counts = np.asarray(pairs_lib.tree_class_counts(classes))
    if config.pair_mode == "naive":
        naive = pair_tokens.naive_dpo_pairs(node_values[-1], step_valid, config.pairs.one_tolerance)
        toks = pair_tokens.gather_naive_dpo_tokens(tree, naive)
        leaf_types = np.asarray(scores.leaf_types).reshape(tree.batch_size, -1)
        rows = np.arange(tree.batch_size)
        chosen = leaf_types[rows, np.asarray(naive.chosen_leaf)]
        rejected = leaf_types[rows, np.asarray(naive.rejected_leaf)]
        grounding = np.stack(
            [np.isin(chosen, pairs_lib.CLICK_LIKE_TYPES), np.isin(rejected, pairs_lib.CLICK_LIKE_TYPES)], axis=1
        )
        return grouping.naive_pair_groups(sampled.steps, toks, grounding, name), counts
    match = scores.action_text_matches_golden
    allows = None
    if config.gamma_consistent_only:
        if scores.thought_names_golden is None:
            raise ValueError("round_pairs: gamma_consistent_only needs TreeScores.thought_names_golden")
        allows = jnp.asarray(scores.thought_names_golden, bool)
    pb = pairs_lib.extract_pairs(
        node_values,
        jnp.asarray(scores.leaf_types, jnp.int32),
        jnp.asarray(scores.golden_types, jnp.int32),
        step_valid,
        step_index=jnp.asarray(tree.step_index, jnp.int32),
        action_text_matches_golden=None if match is None else jnp.asarray(match, bool),
        thought_allows_gamma=allows,
        config=config.pairs,
    )
    pt = pair_tokens.gather_pair_tokens(
        tree,
        pb,
        *(
            jnp.asarray(x, jnp.int32)
            for x in (
                sampled.golden_action_ids,
                sampled.golden_grounding_ids,
                sampled.golden_action_lengths,
                sampled.golden_grounding_lengths,
            )
        ),
    )
    grouped = grouping.tree_pair_groups(sampled.steps, pt, name, pair_batch=pb)
    grouped.skipped += int(pb.dropped)
    return grouped, counts


def json_safe(d: Mapping) -> dict:
    """A metrics dict with numpy scalars as Python numbers (nested dicts kept, dicts inside lists dropped)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out[k] = json_safe(v)
        elif isinstance(v, (list, tuple)):
            out[k] = [float(x) if isinstance(x, (float, np.floating)) else x for x in v if not isinstance(x, Mapping)]
        elif isinstance(v, (np.integer, int)) and not isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (np.floating, float)):
            out[k] = float(v)
        else:
            out[k] = v
    return out


def pair_counts(grouped: grouping.GroupedPairs) -> dict:
    """Pairs per tree class (``beta``, ``gamma``, ``unknown``) and per positive action type (name -> count)."""

    by_class = {"beta": 0, "gamma": 0, "unknown": 0}
    by_type: dict[str, int] = {}
    for p in grouped.pairs:
        cls = {pairs_lib.BETA: "beta", pairs_lib.GAMMA: "gamma"}.get(p.tree_class, "unknown")
        by_class[cls] += 1
        name = ACTION_TYPES[p.pos_type] if 0 <= p.pos_type < len(ACTION_TYPES) else "unknown"
        by_type[name] = by_type.get(name, 0) + 1
    return {"by_class": by_class, "by_type": dict(sorted(by_type.items()))}


def ipl_round(
    state: state_lib.TrainState, config: RoundConfig, stages: RoundStages, round_index: int, rng, *, mesh=None
) -> tuple[state_lib.TrainState, dict]:
    """One round from ``state`` (π(n-1), also the frozen reference), in a straight line: pairs from the sampled
    and scored trees, selection, packing, reference log-probs, the update (and the probe's diagnostics around it).
    Returns (π(n)'s state, the round record); a non-finite loss raises ``NonFiniteLossError``.
    """
    probe_rng, sample_rng, train_rng = jax.random.split(jnp.asarray(rng), 3)
    t0 = time.perf_counter()
    policy = state_lib.model_params(state.params, state.frozen)  # π(n-1): sampler and frozen reference
    sampled = stages.sample(policy, round_index, sample_rng)
    grouped, counts, dropped = _sampled_pairs(sampled, stages.score, config, round_index)
    t1 = time.perf_counter()
    # under a multi-process mesh each process reads the screenshots of its own devices' rows only
    held = distributed.batch_rows(config.packing.rows, mesh)
    batches = packing_lib.pack_round(config.tdpo.model, grouped.groups, grouped.pairs, config.packing, held)
    probe, heldout, context, probe_seconds = stages.probe, None, None, 0.0
    if probe is not None:
        tp = time.perf_counter()
        heldout = _heldout_pairs(probe, policy, config, round_index, probe_rng, held, mesh)
        context = probe.before(policy) if probe.before is not None else None
        probe_seconds = time.perf_counter() - tp
    record = {
        "round": round_index,
        "classes": pairs_lib.tree_class_shares(counts),
        "pairs_by_turn": [int(x) for x in grouped.pairs_by_turn],
        "pairs": len(grouped.pairs),
        "pair_counts": pair_counts(grouped),
        "skipped_pairs": int(grouped.skipped),
        "dropped": dropped,
        "groups": len(grouped.groups),
        "batches": len(batches),
    }
    # the reference log-probs of π(n-1), once, where the update or the diagnostics read them
    wanted = bool(batches) and (stages.update_reads_reference or probe is not None)
    round_data = attach_reference(policy, batches, config.tdpo, mesh=mesh) if wanted else RoundData(batches)
    del policy
    t2 = time.perf_counter()
    update = stages.update or functools.partial(_tdpo_update, config=config.tdpo, mesh=mesh)
    state, train_metrics = update(state, round_data, train_rng)
    record["train"] = {k: v for k, v in train_metrics.items() if k not in ("per_step", "order")}
    t3 = time.perf_counter()
    seconds = {"sample_score_pairs": t1 - t0, "pack_reference": t2 - t1 - probe_seconds, "train": t3 - t2}
    if probe is not None:
        params = state_lib.model_params(state.params, state.frozen)  # π(n)
        record["diagnostics"] = _after_update(probe, params, round_data, heldout, context, config, mesh)
        del params
        seconds["diagnostics"] = probe_seconds + time.perf_counter() - t3
    record["seconds"] = {**seconds, "total": time.perf_counter() - t0}
    return state, json_safe(record)


def _sampled_pairs(sampled: Iterable[SampledTrees], score, config: RoundConfig, round_index: int, name: str = ""):
    """Pairs of scored tree batches, grouped and selected -> (GroupedPairs, class counts int[3], dropped)."""
    grouped = grouping.GroupedPairs()
    counts = np.zeros(3, np.int64)
    for i, batch in enumerate(sampled):
        g, c = round_pairs(batch, score(batch), config, name=f"round {round_index} {name}batch {i} ")
        grouped.extend(g)
        counts += c
    grouped, dropped = select_round_pairs(grouped, config.selection, seed=round_index)
    return grouped, counts, dropped


@dataclasses.dataclass
class _Heldout:
    """Held-out pairs packed like the round's, their log-probs under π(n-1), and how many trees gave them."""

    batches: list
    start: diagnostics_lib.PairLogps
    trees: int


def _heldout_pairs(probe: RoundProbe, policy, config: RoundConfig, round_index: int, rng, held, mesh):
    if probe.heldout is None:
        return None
    scored = list(probe.heldout(policy, rng))
    lookup = {id(s): t for s, t in scored}
    grouped, counts, _ = _sampled_pairs(
        (s for s, _ in scored), lambda s: lookup[id(s)], config, round_index, "held-out "
    )
    batches = packing_lib.pack_round(config.tdpo.model, grouped.groups, grouped.pairs, config.packing, held)
    start = diagnostics_lib.pair_logps(policy, batches, config.tdpo, mesh=mesh)
    return _Heldout(batches=batches, start=start, trees=int(counts.sum()))


def _tdpo_update(state, round_data: RoundData, rng, *, config: TDPOConfig, mesh):
    """The default ``RoundStages.update``: one epoch of T-DPO on the round's pairs (reference attached)."""
    return train_round(state, None, round_data, rng, config, mesh=mesh)


def _after_update(probe: RoundProbe, params, round_data, heldout, context, config: RoundConfig, mesh) -> dict:
    """The diagnostics of π(n): its pair figures on the round's pairs and the held-out ones, and the probe's."""
    beta = config.tdpo.dpo.beta
    batches = round_data.batches
    start = diagnostics_lib.attached_logps(batches)
    end = diagnostics_lib.pair_logps(params, batches, config.tdpo, mesh=mesh)
    out = {"train_pairs": diagnostics_lib.pair_figures(start, end, beta)}
    if heldout is not None:
        end = diagnostics_lib.pair_logps(params, heldout.batches, config.tdpo, mesh=mesh)
        out["heldout_pairs"] = {**diagnostics_lib.pair_figures(heldout.start, end, beta), "trees": heldout.trees}
    if probe.after is not None:
        out.update(probe.after(params, context))
    return out
