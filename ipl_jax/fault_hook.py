"""A test-only fault hook: SIGKILL this process at a named point, as a preempted host dies.

``IPL_JAX_TEST_KILL_AT=sft_step=1`` (after SFT step 1) or ``tdpo_step=2`` (after a round's second T-DPO
update). Unset, ``kill_at`` is one environment lookup. Imports nothing else of ipl_jax.
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
