"""What a round did to preference pairs, from each pair's log-probs under π(n-1) and π(n): ``accuracy_before`` /
``_after`` (log π(s⁺) > log π(s⁻)), ``logp_margin_before`` / ``_after`` and DPO's implicit ``reward_margin``
/ ``reward_accuracy`` after the update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from ipl_jax import distributed
from ipl_jax.model.sharding import param_shardings
from ipl_jax.preference.packed_batch import PackedBatch
from ipl_jax.preference.tdpo import reference_logps


@dataclasses.dataclass(frozen=True)
class PairLogps:
    """Per-pair summed log-probs of a set of pairs: pos / neg f32[P], valid bool[P], turn int32[P]."""

    pos: np.ndarray
    neg: np.ndarray
    valid: np.ndarray
    turn: np.ndarray

    @classmethod
    def concat(cls, parts: Sequence[PairLogps]) -> PairLogps:
        if not parts:
            return cls(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, bool), np.zeros(0, np.int32))
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(cls)))


def attached_logps(batches: Sequence[PackedBatch]) -> PairLogps:
    """The reference log-probs (π(n-1)) a round attached to its batches (``tdpo.attach_reference``)."""
    return PairLogps.concat(
        [
            PairLogps(
                np.asarray(b.ref_pos, np.float32),
                np.asarray(b.ref_neg, np.float32),
                np.asarray(b.pair_valid, bool),
                np.asarray(b.pair_turn, np.int32),
            )
            for b in batches
        ]
    )


def pair_logps(params, batches: Sequence[PackedBatch], config, *, mesh=None) -> PairLogps:
    """Per-pair summed log-probs of ``batches`` under ``params`` (the reference forward, no gradient), as host
    arrays. ``config``: the round's ``TDPOConfig``."""

    if mesh is not None:  # placed by the model's rules, as the round's reference (``tdpo.attach_reference``)
        params = jax.device_put(params, param_shardings(params, mesh))
    parts = []
    for b in batches:
        pos, neg = distributed.to_host(reference_logps(params, b, config, mesh=mesh))
        parts.append(
            PairLogps(
                np.asarray(pos, np.float32),
                np.asarray(neg, np.float32),
                np.asarray(b.pair_valid, bool),
                np.asarray(b.pair_turn, np.int32),
            )
        )
    return PairLogps.concat(parts)


def _share(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if x.size else None


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x, dtype=np.float64)) if x.size else None


def _figures(start: PairLogps, end: PairLogps, beta: float, keep: np.ndarray) -> dict:
    sp, sn, ep, en = (np.asarray(a, np.float64)[keep] for a in (start.pos, start.neg, end.pos, end.neg))
    reward = beta * ((ep - sp) - (en - sn))
    return {
        "pairs": int(keep.sum()),
        "accuracy_before": _share(sp > sn),
        "accuracy_after": _share(ep > en),
        "logp_margin_before": _mean(sp - sn),
        "logp_margin_after": _mean(ep - en),
        "reward_accuracy": _share(reward > 0),
        "reward_margin": _mean(reward),
    }


def pair_figures(start: PairLogps, end: PairLogps, beta: float) -> dict:
    """The module's figures over the valid pairs (None when there is none), and per CoaT turn in ``by_turn``
    ({"0".."4": figures}, 0 = whole trajectories). ``start`` and ``end`` must list the same pairs in order."""
    if start.valid.shape != end.valid.shape or not np.array_equal(start.valid, end.valid):
        raise ValueError("pair_figures: start and end log-probs must cover the same pairs")
    valid = np.asarray(start.valid, bool)
    out = _figures(start, end, beta, valid)
    turns = sorted({int(t) for t in np.asarray(start.turn)[valid]})
    out["by_turn"] = {str(t): _figures(start, end, beta, valid & (np.asarray(start.turn) == t)) for t in turns}
    return out
