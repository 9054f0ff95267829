"""Reader for AITZ (Android-in-the-Zoo), the CoaT dataset, in its published layout (docs/formats.md).

UI boxes are ``[top, left, height, width]`` pixels, gesture points ``[y, x]`` fractions; a DUAL_POINT within
0.04 (L2) is a tap on the smallest box containing it, else a scroll in the finger's direction. An image path
outside the dataset root is a malformed record.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from ipl_jax.coat.actions import Action, format_action
from ipl_jax.data.records import CoaT, DataError, Episode, Step, UIElement, coat_or_none
from ipl_jax.progress import progress

SPLITS = ("train", "test")
SUBSETS = ("general", "install", "google_apps", "single", "web_shopping")

# result_action_type codes (AITW's action_type enum).
TYPE = 3
DUAL_POINT = 4
PRESS_BACK = 5
PRESS_HOME = 6
PRESS_ENTER = 7
TASK_COMPLETE = 10
TASK_IMPOSSIBLE = 11
_PRESS_BUTTONS = {PRESS_BACK: "back", PRESS_HOME: "home", PRESS_ENTER: "enter"}

TAP_DISTANCE = 0.04  # ‖touch − lift‖₂ at or below this (screen fractions) is a tap
VERTICAL_RATIO = 0.9  # a scroll is vertical when |Δy| ≥ 0.9·|Δx|

_REQUIRED_FIELDS = ("episode_id", "step_id", "instruction", "image_path", "result_action_type")
_COAT_FIELDS = ("screen_desc", "action_think", "action_desc", "action_result")


# ---------------------------------------------------------------------------------------------- helpers
# shared with the other readers


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) of an image file, from its header only."""

    with Image.open(path) as img:
        return img.size


def box_area(box: Sequence[float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def box_contains(box: Sequence[float], point: Sequence[float]) -> bool:
    x, y = point
    return box[0] <= x <= box[2] and box[1] <= y <= box[3]


def smallest_box_containing(elements: Iterable[UIElement], point: Sequence[float]) -> UIElement | None:
    """The element with the smallest box that contains ``point`` (x, y); the first one on ties; else None."""
    best, best_area = None, math.inf
    for el in elements:
        if box_contains(el.box, point):
            area = box_area(el.box)
            if area < best_area:
                best, best_area = el, area
    return best


def clamp01(v: float) -> float:
    return min(1.0, max(0.0, float(v)))


def pixel_box_to_fractions(
    x1: float, y1: float, x2: float, y2: float, width: float, height: float
) -> tuple[float, float, float, float]:
    """A pixel box (x1, y1, x2, y2) as screen fractions, clamped to [0, 1] and ordered."""
    fx1, fx2 = sorted((clamp01(x1 / width), clamp01(x2 / width)))
    fy1, fy2 = sorted((clamp01(y1 / height), clamp01(y2 / height)))
    return (fx1, fy1, fx2, fy2)


def with_history(steps: Sequence[Step]) -> tuple[Step, ...]:
    """The steps with ``history`` filled in from the previous steps' action texts."""
    out, history = [], []
    for s in steps:
        out.append(dataclasses.replace(s, history=tuple(history)))
        history.append(format_action(s.action))
    return tuple(out)


def episode_steps(steps: Sequence[Step], bad_ids: Sequence[int]) -> tuple[Step, ...]:
    """An episode's readable ``steps`` in step-id order with their history; the steps after the first skipped one
    (``bad_ids``) are flagged ``history_gap``, since its action is missing from their history."""
    steps = with_history(sorted(steps, key=lambda s: s.step_id))
    if not bad_ids:
        return steps
    first_bad = min(bad_ids)
    gap = {"history_gap": True}
    return tuple(s if s.step_id <= first_bad else dataclasses.replace(s, meta={**s.meta, **gap}) for s in steps)


def bad_step_id(record, index: int) -> int:
    """The step id of a record that could not be read: its ``step_id`` when that is an integer, else its index."""
    sid = record.get("step_id") if isinstance(record, dict) else None
    return sid if isinstance(sid, int) and not isinstance(sid, bool) else index


# ---------------------------------------------------------------------------------------------- one record


def _json_string_field(rec: dict, field: str, where) -> Any:
    """Decode a field that holds JSON inside a string (AITZ's convention); a list or dict is accepted as is."""
    if field not in rec:
        raise DataError(*where, field, "missing")
    raw = rec[field]
    if isinstance(raw, (list, dict)):
        return raw
    if not isinstance(raw, str):
        raise DataError(*where, field, f"expected a JSON string, got {type(raw).__name__}")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise DataError(*where, field, f"not valid JSON: {e.msg}") from None


def _yx_point(rec: dict, field: str, where) -> tuple[float, float]:
    """A ``[y, x]`` fraction pair as (x, y)."""
    v = _json_string_field(rec, field, where)
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(c, (int, float)) for c in v)):
        raise DataError(*where, field, f"expected [y, x], got {v!r}")
    y, x = float(v[0]), float(v[1])
    return (x, y)


def _elements(rec: dict, width: int, height: int, where) -> tuple[UIElement, ...]:
    positions = _json_string_field(rec, "ui_positions", where)
    texts = _json_string_field(rec, "ui_text", where) if "ui_text" in rec else [""] * len(positions)
    kinds = _json_string_field(rec, "ui_types", where) if "ui_types" in rec else [""] * len(positions)
    for name, v in (("ui_positions", positions), ("ui_text", texts), ("ui_types", kinds)):
        if not isinstance(v, list):
            raise DataError(*where, name, f"expected a list, got {type(v).__name__}")
        if len(v) != len(positions):
            raise DataError(*where, name, f"{len(v)} entries but ui_positions has {len(positions)}")
    out = []
    for i, (pos, text, kind) in enumerate(zip(positions, texts, kinds)):
        if not (isinstance(pos, list) and len(pos) == 4 and all(isinstance(c, (int, float)) for c in pos)):
            raise DataError(*where, "ui_positions", f"entry {i}: expected [top, left, height, width], got {pos!r}")
        top, left, h, w = (float(c) for c in pos)
        box = pixel_box_to_fractions(left, top, left + w, top + h, width, height)
        out.append(UIElement(box=box, text=str(text), kind=str(kind)))
    return tuple(out)


def _action(rec: dict, elements: Sequence[UIElement], where) -> Action:
    code = rec["result_action_type"]
    if isinstance(code, bool) or not isinstance(code, int):
        raise DataError(*where, "result_action_type", f"expected an int, got {code!r}")
    if code == DUAL_POINT:
        touch = _yx_point(rec, "result_touch_yx", where)
        lift = _yx_point(rec, "result_lift_yx", where)
        for name, p in (("result_touch_yx", touch), ("result_lift_yx", lift)):
            if not all(0.0 <= c <= 1.0 for c in p):
                raise DataError(*where, name, f"gesture point {p} (x, y) outside [0, 1]")
        dx, dy = lift[0] - touch[0], lift[1] - touch[1]
        if math.hypot(dx, dy) <= TAP_DISTANCE:
            target = smallest_box_containing(elements, touch)
            return Action(
                type="click",
                point=touch,
                box=None if target is None else target.box,
                target=None if target is None else target.text,
            )
        if abs(dy) >= VERTICAL_RATIO * abs(dx):
            direction = "up" if lift[1] < touch[1] else "down"
        else:
            direction = "left" if lift[0] < touch[0] else "right"
        return Action(type="scroll", direction=direction)
    if code == TYPE:
        text = rec.get("result_action_text", "")
        if not isinstance(text, str):
            raise DataError(*where, "result_action_text", f"expected a string, got {type(text).__name__}")
        return Action(type="type", text=text)
    if code in _PRESS_BUTTONS:
        return Action(type="press", button=_PRESS_BUTTONS[code])
    if code == TASK_COMPLETE:
        return Action(type="stop")
    if code == TASK_IMPOSSIBLE:
        return Action(type="stop", status="impossible")
    raise DataError(*where, "result_action_type", f"unknown action code {code}")


def _coat(rec: dict, where) -> CoaT | None:
    """The step's CoaT; None when its ``coat_*`` fields are absent, null or empty (the step reads as action-only)."""
    present = {f: rec.get("coat_" + f) for f in _COAT_FIELDS}
    for f, v in present.items():
        if v is not None and not isinstance(v, str):
            raise DataError(*where, "coat_" + f, f"expected a string, got {type(v).__name__}")
    return coat_or_none(present)


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` stays inside ``root`` once ``..`` and absolute parts are resolved (lexically)."""
    base = os.path.normpath(os.path.abspath(root))
    target = os.path.normpath(os.path.abspath(path))
    return target == base or target.startswith(base + os.sep)


def _resolve_image(split_dir: Path, episode_dir: Path, image_path: str) -> Path | None:
    """The PNG named by ``image_path``: relative to the split directory, else by file name in the episode folder."""
    for candidate in (split_dir / image_path, episode_dir / Path(image_path).name):
        if candidate.is_file():
            return candidate
    return None


def parse_step(rec: Any, file: Path, index: int, split_dir: Path, subset: str) -> Step:
    """One AITZ step record as a ``Step`` (history left empty). Raises ``DataError`` naming the bad field."""
    where = (file, index)
    if not isinstance(rec, dict):
        raise DataError(*where, "<record>", f"expected a JSON object, got {type(rec).__name__}")
    for f in _REQUIRED_FIELDS:
        if f not in rec:
            raise DataError(*where, f, "missing")
    if not isinstance(rec["step_id"], int) or isinstance(rec["step_id"], bool):
        raise DataError(*where, "step_id", f"expected an int, got {rec['step_id']!r}")
    if not isinstance(rec["image_path"], str):
        raise DataError(*where, "image_path", f"expected a string, got {rec['image_path']!r}")
    if not inside(split_dir.parent, split_dir / rec["image_path"]):
        raise DataError(
            *where,
            "image_path",
            f"{rec['image_path']!r} points outside the dataset root "
            f"{split_dir.parent}; image paths must stay inside it",
        )
    image = _resolve_image(split_dir, file.parent, rec["image_path"])
    if image is None:
        raise DataError(*where, "image_path", f"image {rec['image_path']!r} not found")
    try:
        width, height = image_size(image)
    except Exception as e:  # PIL raises several kinds for a broken file
        raise DataError(*where, "image_path", f"unreadable image {image}: {e}") from None
    elements = _elements(rec, width, height, where)
    action = _action(rec, elements, where)
    return Step(
        episode_id=str(rec["episode_id"]),
        step_id=rec["step_id"],
        instruction=str(rec["instruction"]),
        image=str(image),
        screen_size=(width, height),
        action=action,
        elements=elements,
        coat=_coat(rec, where),
        meta={
            **_synth_meta(rec, where),
            "dataset": "aitz",
            "subset": subset,
            "episode_id": str(rec["episode_id"]),
            "step_id": rec["step_id"],
            "image_path": rec["image_path"],
            "file": str(file),
        },
    )


def _synth_meta(rec: dict, where) -> dict:
    """The optional ``synth_meta`` JSON-in-a-string field of ``ipl-jax synth --with-meta``, kept in Step.meta."""
    raw = rec.get("synth_meta")
    if raw is None:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError as e:
        raise DataError(*where, "synth_meta", f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise DataError(*where, "synth_meta", "expected a string holding a JSON object")
    return value


# ---------------------------------------------------------------------------------------------- episodes


def _episode_files(split_dir: Path) -> list[tuple[str, Path]]:
    out = []
    for subset_dir in sorted(p for p in split_dir.iterdir() if p.is_dir()):
        for ep_dir in sorted(p for p in subset_dir.iterdir() if p.is_dir()):
            f = ep_dir / (ep_dir.name + ".json")
            if f.is_file():
                out.append((subset_dir.name, f))
    return out


def _load_episode(subset: str, file: Path, split_dir: Path, skip_bad: bool, skipped: list[DataError]) -> Episode | None:
    try:
        records = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        err = DataError(file, "<file>", "<json>", f"not valid JSON: {e}")
        if not skip_bad:
            raise err from None
        skipped.append(err)
        return None
    if not isinstance(records, list):
        err = DataError(file, "<file>", "<json>", f"expected a list of step records, got {type(records).__name__}")
        if not skip_bad:
            raise err
        skipped.append(err)
        return None
    steps, bad_step_ids = [], []
    for i, rec in enumerate(records):
        try:
            steps.append(parse_step(rec, file, i, split_dir, subset))
        except DataError as err:
            if not skip_bad:
                raise
            skipped.append(err)
            bad_step_ids.append(bad_step_id(rec, i))
    unique, seen = [], set()
    for s in steps:
        if s.step_id in seen:
            err = DataError(file, s.step_id, "step_id", "duplicate step_id in episode")
            if not skip_bad:
                raise err
            skipped.append(err)
            continue
        seen.add(s.step_id)
        unique.append(s)
    if not unique:
        return None
    steps = episode_steps(unique, bad_step_ids)
    return Episode(
        episode_id=steps[0].episode_id,
        instruction=steps[0].instruction,
        steps=steps,
        meta={"dataset": "aitz", "subset": subset, "file": str(file)},
    )


def load_aitz_with_report(
    root: str | Path, split: str, skip_bad: bool = False
) -> tuple[list[Episode], list[DataError]]:
    """Load one AITZ split; also return the malformed records skipped. A malformed record raises ``DataError``
    unless ``skip_bad`` (then the episode's later steps carry ``meta["history_gap"] = True``).
    """
    split_dir = Path(root) / split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"AITZ split directory not found: {split_dir}")
    episodes, skipped = [], []
    for subset, file in progress(_episode_files(split_dir), desc=f"reading AITZ {split}", unit="episode"):
        ep = _load_episode(subset, file, split_dir, skip_bad, skipped)
        if ep is not None:
            episodes.append(ep)
    return episodes, skipped


def load_aitz(root: str | Path, split: str, skip_bad: bool = False) -> list[Episode]:
    """Load one AITZ split (``train`` or ``test``) as episodes of steps; see ``load_aitz_with_report``."""
    return load_aitz_with_report(root, split, skip_bad)[0]
