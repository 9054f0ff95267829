"""The training loop every trainer runs (warm-up SFT, T-DPO, the golden-SFT controls, GRPO, PPO): a step
``(state, batch) -> (state, metrics)`` over an iterable of batches. Written once here: placing the state, the
progress bar, each step's metrics to the host, the non-finite check, checkpoints and the test-only kill point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ipl_jax import distributed, fault_hook
from ipl_jax.progress import progress
from ipl_jax.training.state import TrainState, state_shardings


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf loss or gradient norm; nothing from that step was checkpointed."""


def check_finite(metrics: Mapping[str, Any], step: int) -> None:
    """Raise NonFiniteLossError if the loss or gradient norm of ``step`` is NaN/inf."""
    for key in ("loss", "grad_norm"):
        if key in metrics and not math.isfinite(float(metrics[key])):
            values = {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}
            raise NonFiniteLossError(
                f"step {step}: {key} is {float(metrics[key])} — training stopped before saving; "
                f"the last checkpoint is untouched. metrics: {values}"
            )


def place_state(state: TrainState, optimizer, mesh, shardings=state_shardings) -> TrainState:
    """``state`` where its step runs: under ``mesh`` as global arrays with ``shardings(state, optimizer, mesh)``
    (the model's partition rules), else committed to this process's first device (where an unmeshed jitted step
    leaves its outputs, so the second step does not compile again)."""
    if mesh is not None:
        return distributed.put(state, shardings(state, optimizer, mesh))
    return distributed.on_first_device(state)


_END = object()


@dataclasses.dataclass
class TrainLoop:
    """A trainer's loop: ``step(state, batch) -> (state, device metrics)`` (state donated) over the batches.

    place: called once on the state before the first step (``place_state`` with the trainer's optimizer and
    mesh), or None (already placed). kill_point: the fault hook's name, counted in finished steps. in_flight:
    step k+1 is dispatched before step k's metrics come to the host (the device never waits on the host); not
    with a checkpointer, which saves the state of the step it has checked. check(metrics, step) raises on a
    non-finite step before anything is saved. on_metrics(step, metrics) sees each finished step's host metrics
    (Python floats) and may return values for the bar's postfix. checkpointer: saves on its schedule and at
    ``num_steps``, with ``data_state_fn()`` (the data iterator's state) and ``metadata_fn()``.

    ``state``: the state after the last dispatched step; a batch generator reads it to sample with the current
    policy (the RL learners).
    """

    step: Callable[[Any, Any], tuple[Any, Mapping]]
    kill_point: str
    desc: str
    unit: str = "step"
    place: Callable[[Any], Any] | None = None
    in_flight: bool = False
    check: Callable[[dict, int], None] = check_finite
    on_metrics: Callable[[int, dict], Mapping | None] | None = None
    checkpointer: Any = None
    data_state_fn: Callable[[], Any] | None = None
    metadata_fn: Callable[[], Mapping[str, Any]] | None = None
    state: Any = None

    def run(
        self, state, batches: Iterable, *, start: int = 0, num_steps: int | None = None, total: int | None = None
    ) -> tuple[Any, list[dict]]:
        """Steps ``start + 1, ...`` until ``num_steps`` (None: until the batches run out); ``total``: the bar's
        length (default ``num_steps``). Returns (state, each finished step's host metrics)."""
        if self.in_flight and self.checkpointer is not None:
            raise ValueError("TrainLoop: a checkpointer saves each step's state; in_flight must be False")
        self.state = state if self.place is None else self.place(state)
        batches = batches if hasattr(batches, "__next__") else iter(batches)
        history: list[dict] = []
        pending: list[tuple[int, Mapping]] = []  # dispatched steps whose metrics are still on the device
        count = int(start)
        bar = progress(total=num_steps if total is None else total, desc=self.desc, unit=self.unit, initial=count)
        try:
            while num_steps is None or count < num_steps:
                batch = next(batches, _END)
                if batch is _END:
                    break
                self.state, metrics = self.step(self.state, batch)
                count += 1
                pending.append((count, metrics))
                if len(pending) > int(self.in_flight):
                    self._finish(*pending.pop(0), history, bar, num_steps)
            while pending:
                self._finish(*pending.pop(0), history, bar, num_steps)
        finally:
            bar.close()
            if self.checkpointer is not None:
                self.checkpointer.wait()
        return self.state, history

    def _finish(self, count: int, metrics: Mapping, history: list, bar, num_steps: int | None) -> None:
        """Step ``count``'s metrics to the host, checked, reported, checkpointed; then the kill point."""
        host = {k: float(v) for k, v in distributed.to_host(dict(metrics)).items()}
        self.check(host, count)
        history.append(host)
        bar.update(1)
        postfix = self.on_metrics(count, host) if self.on_metrics is not None else None
        if postfix:
            bar.set_postfix(**postfix)
        if self.checkpointer is not None:
            self.checkpointer.save(
                count,
                self.state,
                data_state=self.data_state_fn() if self.data_state_fn else None,
                metadata=self.metadata_fn() if self.metadata_fn else None,
                force=count == num_steps,
            )
        fault_hook.kill_at(self.kill_point, count)
