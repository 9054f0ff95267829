"""The job's working directory: settings, per-stage outputs and done-markers (with summaries), logs and metrics.
A marker is written once a stage's outputs are complete; only the main process writes, and every stage ends
at a barrier. A workdir made before the starting policy had its own word (``FORMER_STAGES``, ``FORMER_DIRS``) is
read under its old names and written under the new ones.

The workdir may be a local directory or an object-store URI (``gs://BUCKET/run``; ``ipl_jax.storage``). What each
file keeps there, where no rename and no directory exist:

- ``stages/STAGE.done``: write-then-mark. The marker is one object written after the stage's outputs; a reader
  that sees it sees the outputs (object storage is strongly consistent after a write), and a job killed before
  it reruns the stage.
- ``config.json``, ``results.json``, ``job_report.json`` (``write_json``): replaced whole, by a temporary file
  renamed locally and by one upload on a store; a reader sees the old or the new content, never a part.
- ``stage_log.jsonl``, ``metrics.jsonl`` (``append_jsonl``): appended locally; on a store each record rewrites the
  object with this process's copy of it, read once, so a killed job keeps every record but the one being written.
  Only the main process writes them (as every file here).
- directories (``dir``): made locally; on a store nothing is made (a name prefix is all there is).

The stages' own files (policy directories, predictions, checkpoints) are listed in ``ipl_jax.storage``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from ipl_jax import distributed, storage
from ipl_jax.viz.tensorboard_log import TensorBoardLog

# stage / directory -> its name in a workdir made before the rename, read when only that one exists
FORMER_STAGES = {"start": "seed", "eval_start": "eval_seed"}
FORMER_DIRS = {"start": "seed"}
_CURRENT_STAGES = {old: new for new, old in FORMER_STAGES.items()}


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, os.PathLike):  # a local Path, or an epath.Path of a URI
        return os.fspath(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON whole (``storage.write_text``: a temporary file renamed into place locally,
    one upload on an object store)."""
    path = storage.as_path(path)
    storage.write_text(path, json.dumps(obj, indent=1, default=_json_default) + "\n")
    return path


def read_json(path: Path) -> Any:
    return json.loads(storage.as_path(path).read_text(encoding="utf-8"))


class Workdir:
    """Paths, stage markers and logs of one job directory."""

    def __init__(self, root: str | os.PathLike, echo: Callable[[str], None] = print):
        """``root``: a local directory (made) or an object-store URI (``storage.as_path``)."""
        self.root = storage.make_dir(root if storage.is_remote(root) else Path(root).resolve())
        self.remote = storage.is_remote(self.root)
        self._written: dict[str, str] = {}  # on a store: what append_jsonl last wrote to each log
        self.main = distributed.is_main()
        self.echo = echo if self.main else _silent
        self.tensorboard = TensorBoardLog(self.path("tensorboard"), enabled=self.main)

    # ------------------------------------------------------------------------------------------------ paths

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def existing(self, *parts: str) -> Path:
        """``path(*parts)``, or where an older workdir keeps it (``FORMER_DIRS``) when only that exists."""
        p = self.path(*parts)
        former = FORMER_DIRS.get(parts[0]) if parts else None
        if former is not None and not p.exists() and self.path(former, *parts[1:]).exists():
            return self.path(former, *parts[1:])
        return p

    def dir(self, *parts: str) -> Path:
        """``path(*parts)``, made as a directory (on an object store there is nothing to make)."""
        return storage.make_dir(self.path(*parts))

    # ---------------------------------------------------------------------------------------------- markers

    def marker(self, stage: str) -> Path:
        """Where ``stage``'s marker is written."""
        return self.path("stages", f"{stage}.done")

    def found_marker(self, stage: str) -> Path:
        """Where ``stage``'s marker is read: ``marker``, or an older workdir's (``FORMER_STAGES``) when only that
        exists."""
        new = self.marker(stage)
        if not new.is_file() and stage in FORMER_STAGES and self.marker(FORMER_STAGES[stage]).is_file():
            return self.marker(FORMER_STAGES[stage])
        return new

    def is_done(self, stage: str) -> bool:
        return self.found_marker(stage).is_file()

    def summary(self, stage: str) -> dict | None:
        """The summary a finished stage recorded in its marker (None when it has not finished)."""
        return read_json(self.found_marker(stage)) if self.is_done(stage) else None

    def mark_done(self, stage: str, summary: dict) -> None:
        if self.main:
            write_json(self.marker(stage), summary)

    def run_stage(self, stage: str, fn: Callable[[], dict], main_only: bool = False) -> dict:
        """Run ``fn`` unless ``stage`` is finished; returns its summary (with ``seconds``). Every process runs ``fn``,
        or with ``main_only`` only the main one (the others read the marker after the barrier).
        """
        # Processes may see the marker at different moments (a fast main-only stage can finish before another
        # process looks), so a skip passes the same closing barrier as a run: the barriers always pair up.
        distributed.barrier(f"before stage {stage}")
        done = self.summary(stage)
        if done is not None:
            self.log_stage(stage, "skipped", seconds=0.0)
            self.echo(f"[{stage}] already done (marker {self.found_marker(stage).relative_to(self.root)}); skipping")
            distributed.barrier(f"stage {stage}")
            return done
        self.log_stage(stage, "started")
        self.echo(f"[{stage}] ...")
        t0 = time.perf_counter()
        summary = dict(fn() or {}) if self.main or not main_only else {}
        seconds = time.perf_counter() - t0
        summary.setdefault("seconds", round(seconds, 2))
        self.mark_done(stage, summary)
        self.log_stage(stage, "finished", seconds=seconds, peak_device_bytes=device_peak_bytes())
        self.echo(f"[{stage}] done in {seconds:.1f} s")
        distributed.barrier(f"stage {stage}")
        return summary if self.main or not main_only else read_json(self.marker(stage))

    # ------------------------------------------------------------------------------------------------- logs

    def log_stage(self, stage: str, event: str, **fields) -> None:
        self.append_jsonl("stage_log.jsonl", {"time": round(time.time(), 3), "stage": stage, "event": event, **fields})

    def log_metrics(self, record: dict) -> None:
        self.append_jsonl("metrics.jsonl", {"time": round(time.time(), 3), **record})

    def append_jsonl(self, name: str, record: dict) -> None:
        if not self.main:
            return
        line = json.dumps(record, default=_json_default) + "\n"
        written = storage.append_text(self.path(name), line, known=self._written.get(name))
        if self.remote:
            self._written[name] = written

    def stage_log(self) -> list[dict]:
        """The stage log's records, an older workdir's stage names read as today's (``FORMER_STAGES``)."""
        p = self.path("stage_log.jsonl")
        if not p.is_file():
            return []
        records = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [{**e, "stage": _CURRENT_STAGES.get(e["stage"], e["stage"])} for e in records]


def device_peak_bytes() -> int | None:
    """The largest ``peak_bytes_in_use`` of this process's devices; None where the backend keeps no statistics."""

    peaks = []
    for device in jax.local_devices():
        try:
            stats = device.memory_stats()
        except (NotImplementedError, RuntimeError):
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def _silent(*_args, **_kwargs) -> None:
    """The echo of non-main processes."""
