"""Writing episodes in AITZ's published layout (docs/formats.md). A click is a DUAL_POINT at the click point, a
scroll a finger move of ``SWIPE``; ``with_meta`` adds a ``synth_meta`` JSON-string field (the whole step meta, or the
keys named).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from ipl_jax.data.records import Episode, Step

TYPE, DUAL_POINT, PRESS_BACK, PRESS_HOME, PRESS_ENTER, TASK_COMPLETE, TASK_IMPOSSIBLE = 3, 4, 5, 6, 7, 10, 11
NO_POINT = [-1.0, -1.0]
SWIPE = 0.4  # finger travel of a scroll, as a fraction of the screen
# (touch [y, x], lift [y, x]) per finger direction
SCROLL_GESTURES = {
    "up": ([0.5 + SWIPE / 2, 0.5], [0.5 - SWIPE / 2, 0.5]),
    "down": ([0.5 - SWIPE / 2, 0.5], [0.5 + SWIPE / 2, 0.5]),
    "left": ([0.5, 0.5 + SWIPE / 2], [0.5, 0.5 - SWIPE / 2]),
    "right": ([0.5, 0.5 - SWIPE / 2], [0.5, 0.5 + SWIPE / 2]),
}
PRESS_CODES = {"back": PRESS_BACK, "home": PRESS_HOME, "enter": PRESS_ENTER}


def _action_fields(step: Step) -> dict:
    a = step.action
    where = f"episode {step.episode_id} step {step.step_id}"
    touch = lift = NO_POINT
    text = ""
    if a.type == "click":
        if a.point is None:
            raise ValueError(f"{where}: a click without a point cannot be written as AITZ")
        touch = lift = [float(a.point[1]), float(a.point[0])]
        code = DUAL_POINT
    elif a.type == "scroll":
        if a.direction not in SCROLL_GESTURES:
            raise ValueError(f"{where}: scroll direction {a.direction!r} is not up/down/left/right")
        touch, lift = SCROLL_GESTURES[a.direction]
        code = DUAL_POINT
    elif a.type == "type":
        code, text = TYPE, a.text or ""
    elif a.type == "press":
        if a.button not in PRESS_CODES:
            raise ValueError(f"{where}: press button {a.button!r} is not back/home/enter")
        code = PRESS_CODES[a.button]
    elif a.type == "stop":
        code = TASK_IMPOSSIBLE if a.status == "impossible" else TASK_COMPLETE
    else:
        raise ValueError(f"{where}: action type {a.type!r} has no AITZ code")
    return {
        "result_action_type": code,
        "result_touch_yx": json.dumps(touch),
        "result_lift_yx": json.dumps(lift),
        "result_action_text": text,
    }


def step_record(step: Step, episode_length: int, image_path: str, size: tuple[int, int]) -> dict:
    """One AITZ step record; ``size`` = (width, height) of the PNG the boxes refer to."""
    W, H = size
    positions, texts, kinds = [], [], []
    for el in step.elements:
        x1, y1, x2, y2 = el.box
        top, left = round(y1 * H), round(x1 * W)
        positions.append([top, left, round(y2 * H) - top, round(x2 * W) - left])
        texts.append(el.text)
        kinds.append(el.kind)
    coat = step.coat
    rec = {
        "episode_id": step.episode_id,
        "episode_length": episode_length,
        "step_id": step.step_id,
        "instruction": step.instruction,
        "image_path": image_path,
        "ui_positions": json.dumps(positions),
        "ui_text": json.dumps(texts, ensure_ascii=False),
        "ui_types": json.dumps(kinds),
        **_action_fields(step),
        "coat_screen_desc": coat.screen_desc if coat else "",
        "coat_action_think": coat.action_think if coat else "",
        "coat_action_desc": coat.action_desc if coat else "",
        "coat_action_result": coat.action_result if coat else "",
    }
    return rec


def write_aitz_split(
    episodes: Iterable[Episode],
    root,
    split: str,
    compress_level: int = 1,
    with_meta: bool | Sequence[str] = False,
) -> Path:
    """Write episodes under ``root/split`` in the AITZ layout; returns the split directory. The subset is
    ``meta["subset"]`` (default ``general``); ids must be digits. ``with_meta``: True writes every step's whole
    meta as ``synth_meta``, a sequence of keys only those keys (the job keeps ``page_name`` alone, so that nothing
    else it reads changes), False none."""
    split_dir = Path(root) / split
    for ep in episodes:
        if not ep.steps:
            continue
        if not str(ep.episode_id).isdigit():
            raise ValueError(f"episode {ep.episode_id!r}: AITZ episode ids are digits")
        subset = ep.steps[0].meta.get("subset", "general")
        name = f"{subset.upper()}-{ep.episode_id}"
        ep_dir = split_dir / subset / name
        ep_dir.mkdir(parents=True, exist_ok=True)
        records = []
        for step in ep.steps:
            png = f"{name}_{step.step_id}.png"
            img = step.load_image()
            img.save(ep_dir / png, format="PNG", compress_level=compress_level)
            rec = step_record(step, len(ep.steps), f"{subset}/{name}/{png}", img.size)
            meta = step.meta if with_meta is True else {k: step.meta[k] for k in with_meta or () if k in step.meta}
            if with_meta is True or meta:
                rec["synth_meta"] = json.dumps(meta, ensure_ascii=False, sort_keys=True)
            records.append(rec)
        (ep_dir / f"{name}.json").write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
    return split_dir
