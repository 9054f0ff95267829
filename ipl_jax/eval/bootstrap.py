"""Confidence intervals for accuracy gains: a paired bootstrap over whole test episodes (the same for both
policies), each split resampled within itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


def episode_counts(records: Sequence[Mapping]) -> dict[str, tuple[int, int]]:
    """``{episode_id: (exact matches, steps)}`` from prediction records (``episode_id``, ``exact_match``)."""
    out: dict[str, list[int]] = {}
    for r in records:
        e = out.setdefault(str(r["episode_id"]), [0, 0])
        e[0] += int(bool(r["exact_match"]))
        e[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def read_predictions(path: str | Path) -> list[dict]:
    """The records of a ``<split>.predictions.jsonl`` file written by the job's evaluation."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _paired_arrays(base: Mapping[str, tuple[int, int]], other: Mapping[str, tuple[int, int]]):
    if set(base) != set(other):
        missing = sorted(set(base) ^ set(other))[:3]
        raise ValueError(f"paired bootstrap: the two evaluations cover different episodes (e.g. {missing})")
    ids = sorted(base)
    a = np.asarray([base[i] for i in ids], np.float64)  # [E, 2]: exact, steps
    b = np.asarray([other[i] for i in ids], np.float64)
    if np.any(a[:, 1] != b[:, 1]):
        raise ValueError("paired bootstrap: an episode has a different number of steps in the two evaluations")
    return a[:, 0], b[:, 0], a[:, 1]


def paired_gain_interval(
    base_splits: Sequence[Mapping[str, tuple[int, int]]],
    other_splits: Sequence[Mapping[str, tuple[int, int]]],
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict:
    """Gain of ``other`` over ``base`` in mean total step accuracy with a percentile bootstrap interval:
    ``{"gain", "low", "high", "width", "level", "n_boot"}`` as fractions.
    """
    if len(base_splits) != len(other_splits) or not base_splits:
        raise ValueError("paired bootstrap: give the same, non-empty list of splits for both evaluations")
    rng = np.random.default_rng(seed)
    gains = np.zeros(n_boot)
    point = 0.0
    for base, other in zip(base_splits, other_splits):
        a, b, n = _paired_arrays(base, other)
        point += (b.sum() - a.sum()) / n.sum()
        idx = rng.integers(0, len(n), size=(n_boot, len(n)))  # episodes drawn with replacement
        gains += (b[idx].sum(1) - a[idx].sum(1)) / n[idx].sum(1)
    k = len(base_splits)
    point, gains = point / k, gains / k
    lo, hi = np.quantile(gains, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {
        "gain": float(point),
        "low": float(lo),
        "high": float(hi),
        "width": float(hi - lo),
        "level": level,
        "n_boot": int(n_boot),
    }
