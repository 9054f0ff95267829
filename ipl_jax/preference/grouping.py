"""Pairs of sampled CoaT-trees grouped by shared prefix, ready for ``packing.pack_round``: one ``PrefixGroup``
per (tree row, turn, prefix node) with each distinct continuation once, and ``PairRef`` s into it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from ipl_jax import distributed
from ipl_jax.preference.packed_batch import PairRef, PrefixGroup

# ------------------------------------------------------------------------------------ groups from CoaT-trees


def _np(x):
    return distributed.to_host(x)


def _step_prefix(step, upto_turn: int, turn_texts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Prefix of turn ``upto_turn`` for one step: image prefix, then s_l and prompt l+1 for l < upto_turn.
    Returns (ids, scored) where scored marks s_l tokens."""
    parts, scored = [np.asarray(step.prefix_ids, np.int32)], [np.zeros(len(step.prefix_ids), bool)]
    for level in range(1, upto_turn):
        s = np.asarray(turn_texts[level - 1], np.int32)
        q = np.asarray(step.turn_prompt_ids[level - 1], np.int32)  # prompt of turn level + 1
        parts += [s, q]
        scored += [np.ones(s.size, bool), np.zeros(q.size, bool)]
    return np.concatenate(parts), np.concatenate(scored)


@dataclasses.dataclass
class GroupedPairs:
    """Groups and pairs ready for ``pack_round``; ``skipped``: void pairs left out; ``pairs_by_turn``: kept pairs
    per turn (0: whole trajectories).
    """

    groups: list = dataclasses.field(default_factory=list)
    pairs: list = dataclasses.field(default_factory=list)
    skipped: int = 0
    pairs_by_turn: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(5, np.int64))

    def extend(self, other: GroupedPairs) -> GroupedPairs:
        offset = len(self.groups)
        self.groups.extend(other.groups)
        self.pairs.extend(dataclasses.replace(p, group=p.group + offset) for p in other.pairs)
        self.skipped += other.skipped
        self.pairs_by_turn = self.pairs_by_turn + other.pairs_by_turn
        return self


class _GroupBuilder:
    """Collects continuations per prefix key, sharing identical continuations (same tokens and score mask)."""

    def __init__(self):
        self.out = GroupedPairs()
        self._index: dict = {}
        self._conts: list[dict] = []

    def group(self, key, make_group) -> int:
        if key not in self._index:
            self._index[key] = len(self.out.groups)
            self.out.groups.append(make_group())
            self._conts.append({})
        return self._index[key]

    def continuation(self, g: int, ids: np.ndarray, scored: np.ndarray | None = None) -> int:
        ids = np.asarray(ids, np.int32)
        key = (ids.tobytes(), None if scored is None else np.asarray(scored, bool).tobytes())
        seen = self._conts[g]
        if key not in seen:
            seen[key] = len(seen)
            group = self.out.groups[g]
            conts = group.continuations + (ids,)
            masks = None
            if scored is not None or group.scored is not None:
                old = (
                    group.scored
                    if group.scored is not None
                    else tuple(np.ones(len(c), bool) for c in group.continuations)
                )
                masks = old + (np.ones(ids.size, bool) if scored is None else np.asarray(scored, bool),)
            self.out.groups[g] = dataclasses.replace(group, continuations=conts, scored=masks)
        return seen[key]

    def pair(
        self, g: int, pos: int, neg: int, turn: int, pos_type: int = -1, gap: float = 0.0, tree_class: int = -1
    ) -> None:
        self.out.pairs.append(PairRef(g, pos, neg, turn, pos_type, gap, tree_class))
        self.out.pairs_by_turn[turn] += 1


def _pixels(step):
    """A step's screenshot for its groups: its ``ScreenPixels`` when it has one (decoded once, at packing), else
    its ``pixel_values``."""
    pixels = getattr(step, "pixels", None)
    return step.pixel_values if pixels is None else pixels


def tree_pair_groups(steps: Sequence, pair_tokens, name: str = "", pair_batch=None) -> GroupedPairs:
    """Thinking-level pairs of one tree batch, grouped by (row, turn, prefix node); shared continuations appear once.
    steps: per row the prompt segments; pair_tokens: ``pairs.PairTokens``; ``pair_batch`` adds type, gap, class.
    """
    pt = jax.tree.map(_np, pair_tokens)
    meta_arrays = None
    if pair_batch is not None:
        meta_arrays = [np.asarray(x) for x in (pair_batch.positive_type, pair_batch.value_gap, pair_batch.tree_class)]
    b = _GroupBuilder()
    for k in np.flatnonzero(pt.valid):
        row, turn = int(pt.batch_row[k]), int(pt.turn[k])
        pos = pt.positive_tokens[k, : pt.positive_lengths[k]]
        neg = pt.negative_tokens[k, : pt.negative_lengths[k]]
        if pos.size == 0 or neg.size == 0 or np.array_equal(pos, neg):
            b.out.skipped += 1
            continue
        path = tuple(int(x) for x in pt.prefix_path[k, : turn - 1])
        texts = [pt.prefix_tokens[level][k, : pt.prefix_lengths[k, level]] for level in range(turn - 1)]
        step = steps[row]

        def make(step=step, texts=texts, row=row, turn=turn, path=path, k=k):
            ids, _ = _step_prefix(step, turn, texts)
            return PrefixGroup(
                prefix_ids=ids,
                continuations=(),
                pixel_values=_pixels(step),
                image_grid_thw=step.image_grid_thw,
                name=f"{name}step {int(pt.step_index[k])} (row {row}) turn {turn} prefix nodes {path}",
            )

        g = b.group((row, turn, path), make)
        meta = () if meta_arrays is None else (int(meta_arrays[0][k]), float(meta_arrays[1][k]), int(meta_arrays[2][k]))
        b.pair(g, b.continuation(g, pos), b.continuation(g, neg), turn, *meta)
    return b.out


def naive_pair_groups(steps: Sequence, naive_tokens: dict, with_grounding: np.ndarray, name: str = "") -> GroupedPairs:
    """Whole-trajectory pairs of the naive-DPO baseline, one group per tree, continuations scored on the assistant
    turns only. with_grounding: bool[B, 2] (chosen / rejected action takes a grounding turn).
    """
    nt = jax.tree.map(_np, naive_tokens)
    with_grounding = np.asarray(with_grounding, bool)
    b = _GroupBuilder()
    for row in np.flatnonzero(nt["valid"]):
        step = steps[row]
        conts = []
        for side, name_ in enumerate(("chosen", "rejected")):
            n_turns = 4 if with_grounding[row, side] else 3
            texts = [nt[f"{name_}_tokens"][level][row, : nt[f"{name_}_lengths"][row, level]] for level in range(4)]
            full, scored = _full_path(step, texts, n_turns)
            start = len(step.prefix_ids)
            conts.append((full[start:], scored[start:]))
        if (
            conts[0][0].size == 0
            or conts[1][0].size == 0
            or (np.array_equal(conts[0][0], conts[1][0]) and np.array_equal(conts[0][1], conts[1][1]))
        ):
            b.out.skipped += 1
            continue

        def make(step=step, row=row):
            return PrefixGroup(
                prefix_ids=np.asarray(step.prefix_ids, np.int32),
                continuations=(),
                pixel_values=_pixels(step),
                image_grid_thw=step.image_grid_thw,
                name=f"{name}naive row {row}",
            )

        g = b.group(row, make)
        b.pair(g, b.continuation(g, *conts[0]), b.continuation(g, *conts[1]), 0)
    return b.out


def _full_path(step, texts, n_turns: int):
    """Step prefix + s1, prompt 2, s2, ..., s_{n_turns} (ids, scored: True on the s tokens)."""
    ids, scored = _step_prefix(step, n_turns, texts)
    last = np.asarray(texts[n_turns - 1], np.int32)
    return np.concatenate([ids, last]), np.concatenate([scored, np.ones(last.size, bool)])
