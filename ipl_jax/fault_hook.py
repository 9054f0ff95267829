"""A test-only fault hook: SIGKILL this process at ``IPL_JAX_TEST_KILL_AT=point=count``, as a preempted host dies.
The points are the training loops' (``training.loop``), counted in finished steps: ``sft_step`` (warm-up SFT,
from the resumed step), ``tdpo_step``, ``golden_sft_step``, ``grpo_update``, ``ppo_minibatch`` (from 0 each
round). Imports nothing else of ipl_jax.
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
