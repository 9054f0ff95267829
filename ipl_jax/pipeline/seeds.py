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
    """The integer seed of one of round ``round_index``'s draws, from the job's ``seed``.

    purpose, and what it seeds:

    * ``"steps"``: ``seed * 1000 + round``, the round's training steps (``rounds.round_steps``: the steps whose
      CoaT-trees a T-DPO round samples, the same draw a GRPO round's prompts start from, ``rl_round``);
    * ``"diagnostic_steps"``: ``seed * 1000 + round + 500``, the round's probe steps
      (``round_diagnostics.RoundDiagnostics``);
    * ``"rng"``: ``seed * 7919 + round``, the round's JAX key (``jax.random.PRNGKey`` of it: state init, the
      round's sampling / training keys) and the probe's tree-tally seed (the same draws before and after the
      update).

    The values are those the job has always used, so a job's results do not depend on which version derived
    them. The job's other stages (e.g. warm-up SFT's key, the held-out dev steps) use ``seed`` as it is.
    """
    try:
        multiplier, offset = _ROUND_SEEDS[purpose]
    except KeyError:
        raise ValueError(f"round_seed: purpose must be one of {ROUND_SEED_PURPOSES}, got {purpose!r}") from None
    return int(seed) * multiplier + int(round_index) + offset
