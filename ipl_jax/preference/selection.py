"""Round-level selection of pairs between extraction and packing (docs/method.md §6): ``drop_duplicates``,
``balance_types``, ``mix_groups``, applied in that order by ``select_round_pairs``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ipl_jax.preference.grouping import GroupedPairs
from ipl_jax.preference.packed_batch import PairRef
from ipl_jax.preference.sections import PairSelection


def _with_pairs(grouped: GroupedPairs, pairs: list[PairRef], skipped: int = 0) -> GroupedPairs:
    by_turn = np.zeros_like(grouped.pairs_by_turn)
    for p in pairs:
        by_turn[p.turn] += 1
    return GroupedPairs(
        groups=list(grouped.groups), pairs=pairs, skipped=grouped.skipped + skipped, pairs_by_turn=by_turn
    )


def drop_duplicates(grouped: GroupedPairs) -> tuple[GroupedPairs, int]:
    """(pairs without exact copies, first kept; number dropped)."""
    seen, kept = set(), []
    for p in grouped.pairs:
        g = grouped.groups[p.group]
        key = (
            np.asarray(g.prefix_ids, np.int32).tobytes(),
            np.asarray(g.continuations[p.pos], np.int32).tobytes(),
            np.asarray(g.continuations[p.neg], np.int32).tobytes(),
        )
        if key in seen:
            continue
        seen.add(key)
        kept.append(p)
    dropped = len(grouped.pairs) - len(kept)
    return _with_pairs(grouped, kept, dropped), dropped


def balance_types(grouped: GroupedPairs, ratio: float) -> tuple[GroupedPairs, int]:
    """Cap each positive type's pairs at ``ceil(ratio * median count)``, keeping the largest gaps (earlier first on
    ties) in their order. Returns (selected pairs, number dropped)."""
    if ratio <= 0 or not grouped.pairs:
        return grouped, 0
    types = np.asarray([p.pos_type for p in grouped.pairs])
    present, counts = np.unique(types, return_counts=True)
    cap = max(1, math.ceil(ratio * float(np.median(counts))))
    keep = np.ones(len(types), bool)
    for t, n in zip(present, counts):
        if n <= cap:
            continue
        idx = np.flatnonzero(types == t)
        gaps = np.asarray([grouped.pairs[i].gap for i in idx])
        order = idx[np.lexsort((idx, -gaps))]  # larger gap first, then earlier
        keep[order[cap:]] = False
    kept = [p for p, k in zip(grouped.pairs, keep) if k]
    return _with_pairs(grouped, kept, len(grouped.pairs) - len(kept)), int((~keep).sum())


def mix_groups(grouped: GroupedPairs, seed: int) -> GroupedPairs:
    """Groups in a seeded random order (pair group indices remapped), so packed batches mix trees."""
    perm = np.random.default_rng(seed).permutation(len(grouped.groups))
    new_index = np.empty_like(perm)
    new_index[perm] = np.arange(len(perm))
    pairs = sorted(
        (dataclasses.replace(p, group=int(new_index[p.group])) for p in grouped.pairs), key=lambda p: p.group
    )
    return GroupedPairs(
        groups=[grouped.groups[i] for i in perm],
        pairs=pairs,
        skipped=grouped.skipped,
        pairs_by_turn=grouped.pairs_by_turn.copy(),
    )


def select_round_pairs(grouped: GroupedPairs, selection: PairSelection, seed: int) -> tuple[GroupedPairs, dict]:
    """``selection``'s steps in order: dedup -> type balance (``type_balance`` > 0) -> mixing seeded by ``seed``.
    Returns (pairs, counts dropped)."""
    stats = {"duplicates": 0, "type_balance": 0}
    if selection.dedup:
        grouped, stats["duplicates"] = drop_duplicates(grouped)
    if selection.type_balance > 0:
        grouped, stats["type_balance"] = balance_types(grouped, selection.type_balance)
    if selection.mix_trees:
        grouped = mix_groups(grouped, seed)
    return grouped, stats
