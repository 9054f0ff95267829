"""Writing episodes in AndroidControl's published layout (docs/formats.md): one TFRecord shard per split and the
split files. An episode of K steps ending in ``stop`` becomes K screenshots and K-1 actions (no end action).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path

from ipl_jax.coat.actions import Action, format_action
from ipl_jax.data.a11y import elements_forest
from ipl_jax.data.android_control import CONTENT_OF_FINGER
from ipl_jax.data.records import Episode, Step
from ipl_jax.data.tfrecords import example_bytes, write_tfrecords

SUBSPLIT_OF = {"test": "IDD", "test_app_unseen": "app_unseen", "test_task_unseen": "task_unseen"}
SPLIT_OF = {"train": "train", "dev": "validation", **dict.fromkeys(SUBSPLIT_OF, "test")}
SUBSPLITS = ("IDD", "app_unseen", "task_unseen", "category_unseen")
INFO = "synth_info.json"  # {synthetic split: {"episode_ids": [...], ...what ipl-jax synth records}}
_BUTTONS = {"back": "navigate_back", "home": "navigate_home", "enter": "keyboard_enter"}


def shard_path(root, split: str) -> Path:
    """The one shard of a synthetic split."""
    return Path(root) / f"android_control-{split}-00000-of-00001"


def action_json(action: Action, width: int, height: int, where: str) -> dict:
    """One step's action in AndroidControl's JSON (``where`` names the step in errors)."""
    t = action.type
    if t in ("click", "long_press"):
        if action.point is None:
            raise ValueError(f"{where}: a {t} without a point cannot be written as AndroidControl")
        x, y = action.point
        return {"action_type": t, "x": round(x * width), "y": round(y * height)}
    if t == "scroll":
        if action.direction not in CONTENT_OF_FINGER:
            raise ValueError(f"{where}: scroll direction {action.direction!r} is not up/down/left/right")
        return {"action_type": "scroll", "direction": CONTENT_OF_FINGER[action.direction]}
    if t == "type":
        return {"action_type": "input_text", "text": action.text or ""}
    if t == "open_app":
        return {"action_type": "open_app", "app_name": action.text or ""}
    if t == "press" and action.button in _BUTTONS:
        return {"action_type": _BUTTONS[action.button]}
    if t == "wait":
        return {"action_type": "wait"}
    raise ValueError(f"{where}: action {format_action(action)!r} has no AndroidControl form")


def _png(step: Step, compress_level: int) -> tuple[bytes, tuple[int, int]]:
    img = step.load_image()
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue(), img.size


def episode_example(ep: Episode, compress_level: int = 1) -> bytes:
    """One episode as a serialized ``tf.train.Example``. Raises ValueError unless its id is digits and it ends with
    its only ``stop`` after at least one action."""
    steps = ep.steps
    if not str(ep.episode_id).isdigit():
        raise ValueError(f"episode {ep.episode_id!r}: AndroidControl episode ids are integers")
    stops = [s.step_id for s in steps if s.action.type == "stop"]
    if len(steps) < 2 or stops != [steps[-1].step_id]:
        raise ValueError(
            f"episode {ep.episode_id}: AndroidControl holds episodes of one or more actions ending on a screen; "
            f"this one must end with its only stop after them ({len(steps)} steps, stops at {stops})"
        )
    shots, sizes = zip(*(_png(s, compress_level) for s in steps))
    acted = list(zip(steps[:-1], sizes))  # the stop's screen is the last screenshot, without an action
    actions = [action_json(s.action, *size, f"episode {ep.episode_id} step {s.step_id}") for s, size in acted]
    return example_bytes(
        {
            "episode_id": ([int(ep.episode_id)], "int"),
            "goal": ([ep.instruction.encode()], "byte"),
            "screenshots": (list(shots), "byte"),
            "screenshot_widths": ([w for w, _ in sizes], "int"),
            "screenshot_heights": ([h for _, h in sizes], "int"),
            "accessibility_trees": ([elements_forest(s.elements, *size) for s, size in zip(steps, sizes)], "byte"),
            "actions": ([json.dumps(a).encode() for a in actions], "byte"),
            "step_instructions": ([(s.step_instruction or format_action(s.action)).encode() for s, _ in acted], "byte"),
        }
    )


def read_info(root) -> dict:
    """``synth_info.json`` of an AndroidControl root written here ({} when there is none)."""
    path = Path(root) / INFO
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_android_control_split(
    episodes: Iterable[Episode], root, split: str, compress_level: int = 1, info: dict | None = None
) -> Path:
    """Write a split's episodes as its shard under ``root`` (replacing an earlier one), record their ids in
    ``synth_info.json`` and rebuild the split files; returns the shard's path."""
    if split not in SPLIT_OF:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLIT_OF)}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ids: list[int] = []

    def examples():
        for ep in episodes:
            payload = episode_example(ep, compress_level)
            ids.append(int(ep.episode_id))
            yield payload

    shard = shard_path(root, split)
    write_tfrecords(shard, examples())
    record = read_info(root)
    record[split] = {**(info or {}), "episode_ids": ids}
    (root / INFO).write_text(json.dumps(record, indent=1), encoding="utf-8")
    splits = {name: [] for name in ("train", "validation", "test")}
    subsplits = {name: [] for name in SUBSPLITS}
    for name, entry in record.items():
        splits[SPLIT_OF[name]] += entry["episode_ids"]
        if name in SUBSPLIT_OF:
            subsplits[SUBSPLIT_OF[name]] += entry["episode_ids"]
    (root / "splits.json").write_text(json.dumps(splits), encoding="utf-8")
    (root / "test_subsplits.json").write_text(json.dumps(subsplits), encoding="utf-8")
    return shard
