"""A test-only fault hook: kill this process at a named point, as a preempted host dies (SIGKILL: no cleanup, no
flush, no exit handlers), so that tests can stop one process of a multi-process job at a deterministic place.

    IPL_JAX_TEST_KILL_AT=sft_step=1      # killed right after SFT step 1 (its checkpoint save just started)
    IPL_JAX_TEST_KILL_AT=tdpo_step=2     # killed right after a round's second T-DPO update was dispatched

The variable is set by a test in the environment of the one process it kills. Points: ``sft_step`` (warm-up SFT,
``training.step.train_loop``: the global step just finished) and ``tdpo_step`` (a round's T-DPO epoch,
``preference.tdpo.train_round``: updates dispatched in this round). Unset, as in every normal run, ``kill_at`` is
one environment lookup and does nothing. This module imports nothing else of ipl_jax: every room may use it.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "IPL_JAX_TEST_KILL_AT"


def kill_at(point: str, count: int) -> None:
    """SIGKILL this process when ``IPL_JAX_TEST_KILL_AT`` is ``point=count``; otherwise nothing."""
    if os.environ.get(ENV) == f"{point}={int(count)}":
        print(f"{ENV}: killing process {os.getpid()} at {point}={count}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
