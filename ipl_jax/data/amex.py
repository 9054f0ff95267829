"""Reader for AMEX (Android Multi-annotation EXpo) in its published layout (docs/formats.md).

Pixel coords and boxes are normalised by ``device_dim``; a TAP's target is the smallest clickable box
containing it. ``split=None`` reads every episode, a named split ``instruction_anno/<split>/``.
``Step.meta["app"]``: the app of an ``Open <App>.`` instruction, or None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ipl_jax.coat.actions import Action
from ipl_jax.data.aitz import (
    bad_step_id,
    episode_steps,
    image_size,
    inside,
    pixel_box_to_fractions,
    smallest_box_containing,
)
from ipl_jax.data.records import DataError, Episode, Step, UIElement
from ipl_jax.progress import progress

# The nine apps of MobileIPL's AMEX table, lower case, as written in ``Open <App>.`` instructions.
TEST_APPS = (
    "gmail",
    "booking",
    "youtube music",
    "shein",
    "nbc news",
    "citymapper",
    "microsoft to do",
    "signal",
    "yelp",
)
ACTIONS = ("TAP", "SWIPE", "TYPE", "PRESS_BACK", "PRESS_HOME", "PRESS_ENTER", "TASK_COMPLETE", "TASK_IMPOSSIBLE")

_KNOWN_APP = re.compile(
    r"\bopen\s+(?:the\s+)?(" + "|".join(re.escape(a) for a in sorted(TEST_APPS, key=len, reverse=True)) + r")\b",
    re.IGNORECASE,
)
_ANY_APP = re.compile(r"^\s*open\s+(?:the\s+)?([^.,;:!?]+?)(?:\s+app)?\s*[.,;:!?]", re.IGNORECASE)


def app_of_instruction(instruction: str) -> str | None:
    """The app named by an ``Open <App>.`` instruction, lower case (one of ``TEST_APPS`` when it is one), else None."""
    m = _KNOWN_APP.search(instruction)
    if m is not None:
        return " ".join(m.group(1).lower().split())
    m = _ANY_APP.match(instruction)
    if m is not None:
        return " ".join(m.group(1).lower().split())
    return None


# ---------------------------------------------------------------------------------------------- one step


def _pixel_xy(step: dict, field: str, where) -> tuple[float, float]:
    v = step.get(field)
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(c, (int, float)) for c in v)):
        raise DataError(*where, field, f"expected pixel [x, y], got {v!r}")
    return (float(v[0]), float(v[1]))


def _device_dim(step: dict, where) -> tuple[int, int]:
    v = step.get("device_dim")
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(c, (int, float)) and c > 0 for c in v)):
        raise DataError(*where, "device_dim", f"expected [W, H] > 0, got {v!r}")
    return (int(v[0]), int(v[1]))


def _element_text(el: dict) -> str:
    desc = el.get("xml_desc") or []
    if isinstance(desc, str):
        desc = [desc]
    for d in desc:
        if isinstance(d, str) and d.strip():
            return d.strip()
    return ""


def load_elements(file: Path, width: int, height: int) -> tuple[UIElement, ...]:
    """Clickable then scrollable elements of one ``element_anno`` file, boxes in fractions of (width, height)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(file, "<file>", "<json>", f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise DataError(file, "<file>", "<json>", f"expected an object, got {type(data).__name__}")
    out = []
    for key, clickable in (("clickable_elements", True), ("scrollable_elements", False)):
        items = data.get(key, [])
        if not isinstance(items, list):
            raise DataError(file, "<file>", key, f"expected a list, got {type(items).__name__}")
        for i, el in enumerate(items):
            bbox = el.get("bbox") if isinstance(el, dict) else None
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(c, (int, float)) for c in bbox)):
                raise DataError(file, f"{key}[{i}]", "bbox", f"expected [x1, y1, x2, y2] px, got {bbox!r}")
            out.append(
                UIElement(
                    box=pixel_box_to_fractions(*bbox, width, height),
                    text=_element_text(el),
                    kind="clickable" if clickable else "scrollable",
                    clickable=clickable,
                )
            )
    return tuple(out)


def _resolve_screenshot(root: Path, image_path: str) -> Path | None:
    for candidate in (root / "screenshot" / image_path, root / image_path, root / "screenshot" / Path(image_path).name):
        if candidate.is_file():
            return candidate
    return None


def _action(step: dict, elements: Sequence[UIElement], width: int, height: int, where) -> Action:
    kind = step.get("action")
    if kind not in ACTIONS:
        raise DataError(*where, "action", f"unknown action {kind!r}")
    if kind in ("TAP", "SWIPE"):
        touch = _pixel_xy(step, "touch_coord", where)
        lift = _pixel_xy(step, "lift_coord", where)
        for name, (x, y) in (("touch_coord", touch), ("lift_coord", lift)):
            if not (0 <= x <= width and 0 <= y <= height):
                raise DataError(*where, name, f"point ({x}, {y}) outside the device {width}x{height}")
        if kind == "TAP":
            point = (touch[0] / width, touch[1] / height)
            target = smallest_box_containing((e for e in elements if e.clickable), point)
            return Action(
                type="click",
                point=point,
                box=None if target is None else target.box,
                target=None if target is None else target.text,
            )
        dx, dy = (lift[0] - touch[0]) / width, (lift[1] - touch[1]) / height
        if dx == 0 and dy == 0:
            raise DataError(*where, "lift_coord", "SWIPE with zero length")
        if abs(dx) > abs(dy):
            return Action(type="scroll", direction="left" if dx < 0 else "right")
        return Action(type="scroll", direction="up" if dy < 0 else "down")
    if kind == "TYPE":
        text = step.get("type_text")
        if not isinstance(text, str):
            raise DataError(*where, "type_text", f"expected a string, got {text!r}")
        return Action(type="type", text=text)
    if kind.startswith("PRESS_"):
        return Action(type="press", button=kind[len("PRESS_") :].lower())
    if kind == "TASK_COMPLETE":
        return Action(type="stop")
    return Action(type="stop", status="impossible")


def parse_step(step: Any, file: Path, index: int, root: Path, episode_id: str, instruction: str, app) -> Step:
    """One AMEX step as a ``Step`` (history left empty). Raises ``DataError`` naming the bad field."""
    where = (file, f"steps[{index}]")
    if not isinstance(step, dict):
        raise DataError(*where, "<step>", f"expected an object, got {type(step).__name__}")
    image_rel = step.get("image_path")
    if not isinstance(image_rel, str) or not image_rel:
        raise DataError(*where, "image_path", f"expected a file name, got {image_rel!r}")
    step_id = step.get("step_id", index)
    if not isinstance(step_id, int) or isinstance(step_id, bool):
        raise DataError(*where, "step_id", f"expected an int, got {step_id!r}")
    width, height = _device_dim(step, where)
    if not all(inside(root, c) for c in (root / "screenshot" / image_rel, root / image_rel)):
        raise DataError(
            *where,
            "image_path",
            f"{image_rel!r} points outside the dataset root {root}; image paths must stay inside it",
        )
    image = _resolve_screenshot(root, image_rel)
    if image is None:
        raise DataError(*where, "image_path", f"screenshot {image_rel!r} not found under {root / 'screenshot'}")
    try:
        screen_size = image_size(image)
    except Exception as e:  # PIL raises several kinds for a broken file
        raise DataError(*where, "image_path", f"unreadable screenshot {image}: {e}") from None
    element_file = root / "element_anno" / (Path(image_rel).stem + ".json")
    elements = load_elements(element_file, width, height) if element_file.is_file() else ()
    return Step(
        episode_id=episode_id,
        step_id=step_id,
        instruction=instruction,
        image=str(image),
        screen_size=screen_size,
        action=_action(step, elements, width, height, where),
        elements=elements,
        meta={
            "dataset": "amex",
            "app": app,
            "episode_id": episode_id,
            "step_id": step_id,
            "image_path": image_rel,
            "file": str(file),
            "record": where[1],
            "has_element_anno": element_file.is_file(),
        },
    )


# ---------------------------------------------------------------------------------------------- episodes


def _episode_files(root: Path, split: str | None) -> list[Path]:
    anno = root / "instruction_anno"
    if not anno.is_dir():
        raise FileNotFoundError(f"AMEX instruction_anno folder not found under {root}")
    if split is not None:
        anno = anno / split
        if not anno.is_dir():
            raise FileNotFoundError(
                f"AMEX split {split!r}: no folder {anno} (AMEX publishes no split files; pass split=None and "
                "select with episode_ids, or place the split's episode files there)"
            )
    return sorted(anno.glob("*.json"))


def _load_episode(file: Path, root: Path, skip_bad: bool, skipped: list[DataError]) -> Episode | None:
    def bad(err: DataError):
        if not skip_bad:
            raise err
        skipped.append(err)

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        bad(DataError(file, "<file>", "<json>", f"not valid JSON: {e}"))
        return None
    if not isinstance(data, dict):
        bad(DataError(file, "<file>", "<json>", f"expected an object, got {type(data).__name__}"))
        return None
    for field in ("instruction", "steps"):
        if field not in data:
            bad(DataError(file, "<episode>", field, "missing"))
            return None
    if not isinstance(data["instruction"], str) or not isinstance(data["steps"], list):
        bad(DataError(file, "<episode>", "steps", "expected instruction: str and steps: list"))
        return None
    episode_id = str(data.get("episode_id", file.stem))
    instruction = data["instruction"]
    app = app_of_instruction(instruction)
    steps, bad_ids = [], []
    for i, raw in enumerate(data["steps"]):
        try:
            steps.append(parse_step(raw, file, i, root, episode_id, instruction, app))
        except DataError as err:
            bad(err)
            bad_ids.append(bad_step_id(raw, i))
    unique, first_index = [], {}
    for s in steps:
        if s.step_id in first_index:
            bad(
                DataError(
                    file,
                    s.meta["record"],
                    "step_id",
                    f"duplicate step_id {s.step_id} (also {first_index[s.step_id]}); step ids must be unique "
                    f"within an episode",
                )
            )
            bad_ids.append(s.step_id)
            continue
        first_index[s.step_id] = s.meta["record"]
        unique.append(s)
    if not unique:
        return None
    steps = episode_steps(unique, bad_ids)
    return Episode(
        episode_id=episode_id,
        instruction=instruction,
        steps=steps,
        meta={"dataset": "amex", "app": app, "file": str(file)},
    )


def load_amex_with_report(
    root: str | Path,
    split: str | None = None,
    skip_bad: bool = False,
    episode_ids: Iterable[str] | None = None,
) -> tuple[list[Episode], list[DataError]]:
    """Load AMEX episodes; also return the malformed records skipped. A malformed step raises ``DataError`` unless
    ``skip_bad`` (then the episode's later steps carry ``meta["history_gap"] = True``).
    """
    root = Path(root)
    wanted = None if episode_ids is None else {str(e) for e in episode_ids}
    episodes, skipped = [], []
    files = [f for f in _episode_files(root, split) if wanted is None or f.stem in wanted]
    for file in progress(files, desc="reading AMEX", unit="episode"):
        ep = _load_episode(file, root, skip_bad, skipped)
        if ep is not None:
            episodes.append(ep)
    return episodes, skipped


def load_amex(
    root: str | Path,
    split: str | None = None,
    skip_bad: bool = False,
    episode_ids: Iterable[str] | None = None,
) -> list[Episode]:
    """Load AMEX episodes as steps; see ``load_amex_with_report``."""
    return load_amex_with_report(root, split, skip_bad, episode_ids)[0]
