"""The job's per-round seeds: one derivation from ``settings.seed`` for every draw a round makes."""

from __future__ import annotations

# purpose -> (multiplier of the job's seed, offset added to the round index)
_ROUND_SEEDS = {
    "steps": (1000, 0),
    "diagnostic_steps": (1000, 500),
    "rng": (7919, 0),
}
ROUND_SEED_PURPOSES = tuple(_ROUND_SEEDS)


def round_seed(seed: int, round_index: int, purpose: str) -> int:
    """The seed of one of round ``round_index``'s draws: ``"steps"`` ``seed * 1000 + round``; ``"diagnostic_steps"``
    ``seed * 1000 + round + 500``; ``"rng"`` ``seed * 7919 + round``.
    """
    try:
        multiplier, offset = _ROUND_SEEDS[purpose]
    except KeyError:
        raise ValueError(f"round_seed: purpose must be one of {ROUND_SEED_PURPOSES}, got {purpose!r}") from None
    return int(seed) * multiplier + int(round_index) + offset
