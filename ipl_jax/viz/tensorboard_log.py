"""TensorBoard event files of a job (runs ``sft/`` and ``ipl/``), from the same records as ``metrics.jsonl`` and
``results.json``; written without TensorFlow, by the main process, flushed every batch. Under an object-store URI
(which has no append) the files are written in this host's scratch and uploaded whole after every batch.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping
from pathlib import Path

from PIL import Image
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from ipl_jax import storage
from ipl_jax.viz.plots import TYPE_ROWS

# pairs_by_turn index -> tag name (index 0: pairs between whole trajectories, then one per CoaT turn)
TURN_TAGS = ("trajectory", "turn1", "turn2", "turn3", "turn4")


def _number(v) -> float | None:
    """A finite-or-not float for a JSON scalar (bools count); None for anything else (None, text, lists)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def sft_scalars(record: Mapping) -> dict[str, float]:
    """The TensorBoard scalars of one SFT record of ``metrics.jsonl`` (``stage == "sft"``)."""
    names = {"loss": "loss", "lr": "learning_rate", "tokens_per_s": "tokens_per_s", "grad_norm": "grad_norm"}
    return {f"sft/{tag}": float(record[k]) for k, tag in names.items() if _number(record.get(k)) is not None}


def round_scalars(entry: Mapping) -> dict[str, float]:
    """The TensorBoard scalars of one ``results.json`` round entry (fields it lacks give no tag)."""
    out: dict[str, float] = {}

    def put(tag: str, v) -> None:
        if _number(v) is not None:
            out[tag] = _number(v)

    for k, v in (entry.get("train") or {}).items():
        put(f"train/{k}", v)
    put("pairs/total", entry.get("pairs"))
    for name, n in zip(TURN_TAGS, entry.get("pairs_by_turn") or ()):
        put(f"pairs/by_turn/{name}", n)
    counts = entry.get("pair_counts") or {}
    for group in ("by_class", "by_type"):
        for k, n in (counts.get(group) or {}).items():
            put(f"pairs/{group}/{k}", n)
    for k, v in (entry.get("trees") or {}).items():
        put(f"trees/{k}", v)
    for split, table in (entry.get("metrics") or {}).items():
        for row in TYPE_ROWS + ("total",):
            cell = table.get(row) or {}
            put(f"step_accuracy/{split}/{row}", cell.get("exact_acc"))
            put(f"type_accuracy/{split}/{row}", cell.get("type_acc"))
        put(f"episode_success/{split}", table.get("episode_success"))
    for split, table in (entry.get("blank") or {}).items():
        put(f"blank_step_accuracy/{split}", (table.get("total") or {}).get("exact_acc"))
    for k, v in (entry.get("dev") or {}).items():
        put(f"dev/{k}", v)
    for k in ("success_rate", "mean_steps", "truncated_rate"):
        put(f"online/{k}", (entry.get("online") or {}).get(k))
    for k in ("seconds", "samples", "budget"):
        put(f"round/{k}", entry.get(k))
    for section, figures in (entry.get("diagnostics") or {}).items():
        for k, v in (figures or {}).items():
            put(f"diagnostics/{section}/{k}", v)
    return out


class TensorBoardLog:
    """The job's event files under ``root`` (one writer per run); does nothing unless ``enabled``."""

    def __init__(self, root: str | Path, enabled: bool = True):
        self.root = storage.as_path(root)  # a URI stays one (pathlib would make gs://B/x the local /gs/B/x)
        self.enabled = bool(enabled)
        self._writers: dict[str, EventFileWriter] = {}
        self._local = None  # on an object store: where the files are written before each upload
        if self.enabled and storage.is_remote(self.root):
            self._local = storage.scratch_dir(self.root, "tensorboard")

    def _write(self, run: str, step: int, values: list[summary_pb2.Summary.Value]) -> None:
        if not self.enabled or not values:
            return
        if run not in self._writers:
            self._writers[run] = EventFileWriter(str((self.root if self._local is None else self._local) / run))
        writer = self._writers[run]
        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values))
        writer.add_event(event)
        writer.flush()
        if self._local is not None:
            storage.upload_tree(self._local / run, self.root / run)

    def scalars(self, run: str, step: int, values: Mapping[str, float]) -> None:
        """Scalars ``{tag: value}`` at ``step`` of ``run``, as one event."""
        self._write(run, step, [summary_pb2.Summary.Value(tag=t, simple_value=float(v)) for t, v in values.items()])

    def image(self, run: str, tag: str, png: str | Path, step: int) -> None:
        """A PNG file as an image summary (the file's bytes as they are)."""
        if not self.enabled:
            return
        data = storage.as_path(png).read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            (width, height), channels = im.size, len(im.getbands())
        image = summary_pb2.Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=data)
        self._write(run, step, [summary_pb2.Summary.Value(tag=tag, image=image)])

    def sft(self, record: Mapping) -> None:
        """One SFT step's ``metrics.jsonl`` record."""
        self.scalars("sft", int(record["step"]), sft_scalars(record))

    def round(self, entry: Mapping) -> None:
        """One ``results.json`` round entry (step = its round)."""
        self.scalars("ipl", int(entry["round"]), round_scalars(entry))

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
