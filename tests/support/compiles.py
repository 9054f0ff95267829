"""Counting the programs JAX traces while a block runs, read through ``jax.monitoring`` (each jit cache miss
traces its function once and reports the function's name)."""

from __future__ import annotations

import collections
import contextlib

import jax

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


@contextlib.contextmanager
def count_traces():
    """Yields a Counter {function name: programs traced} filled while the block runs."""
    counts: collections.Counter = collections.Counter()

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == TRACE_EVENT:
            counts[kwargs.get("fun_name", "?")] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
