"""The predictions file scored by ``ipl-jax score`` (docs/formats.md): one JSON line per step. Parsing a
prediction never raises (unusable: a miss); ``load_predictions`` raises ``DataError`` (file, line).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ipl_jax.coat.actions import (
    ACTION_TYPES,
    BOX_START,
    BUTTONS,
    DIRECTIONS,
    Action,
    box_center,
    invalid_action,
    parse_action,
)
from ipl_jax.data.records import DataError


def split_prediction_text(text: str) -> tuple[str, str | None]:
    """(action text, grounding text or None) of a raw prediction string."""
    i = text.find(BOX_START)
    if i >= 0:
        return text[:i], text[i:]
    head, sep, rest = text.strip().partition("\n")
    return head, (rest if sep and rest.strip() else None)


def _fraction(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) and 0.0 <= v <= 1.0 else None


def _fractions(v: Any, n: int) -> tuple[float, ...] | None:
    if not isinstance(v, (list, tuple)) or len(v) != n:
        return None
    out = tuple(_fraction(x) for x in v)
    return None if any(x is None for x in out) else out


def structured_action(d: dict) -> Action:
    """A structured prediction (``{"type": ...}``) as an Action; anything unusable gives an invalid action."""
    if d.get("parsed") is False:
        return invalid_action()
    t = d.get("type")
    t = t.lower() if isinstance(t, str) else None
    if t not in ACTION_TYPES:
        return invalid_action()
    if t in ("click", "long_press"):
        box = _fractions(d["box"], 4) if d.get("box") is not None else None
        if "x" in d or "y" in d:
            point = _fractions([d.get("x"), d.get("y")], 2)
        elif d.get("point") is not None:
            point = _fractions(d["point"], 2)
        elif box is not None:
            point = box_center(box)
        else:
            point = None
        if point is None:
            return invalid_action()
        return Action(
            type=t, point=point, box=box, target=d.get("target") if isinstance(d.get("target"), str) else None
        )
    if t in ("type", "open_app"):
        text = d.get("text")
        return Action(type=t, text=text) if isinstance(text, str) else invalid_action()
    if t == "scroll":
        direction = d.get("direction")
        direction = direction.lower() if isinstance(direction, str) else None
        return Action(type=t, direction=direction) if direction in DIRECTIONS else invalid_action()
    if t == "press":
        button = d.get("button")
        button = button.lower() if isinstance(button, str) else None
        return Action(type=t, button=button) if button in BUTTONS else invalid_action()
    status = d.get("status") if isinstance(d.get("status"), str) else None
    return Action(type=t, status=status if t == "stop" else None)


def prediction_to_action(p: Any) -> Action:
    """One ``prediction`` value (string, text dict or structured dict) as an Action. Never raises."""
    if isinstance(p, str):
        action_text, grounding = split_prediction_text(p)
        return parse_action(action_text, grounding)
    if isinstance(p, dict):
        if "action" in p:
            a, g = p.get("action"), p.get("grounding")
            if not isinstance(a, str):
                return invalid_action()
            return parse_action(a, g if isinstance(g, str) else None)
        if "type" in p:
            return structured_action(p)
    return invalid_action()


def load_predictions(path: str | Path) -> dict[tuple[str, int], Action]:
    """Read a predictions JSONL file into ``{(episode_id, step_id): Action}``; blank lines are skipped."""
    path = Path(path)
    out: dict[tuple[str, int], Action] = {}
    seen_at: dict[tuple[str, int], int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = (path, f"line {n}")
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(*where, "<json>", f"not valid JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(rec, dict):
                raise DataError(*where, "<json>", f"expected a JSON object, got {type(rec).__name__}")
            for field in ("episode_id", "step_id", "prediction"):
                if field not in rec:
                    raise DataError(*where, field, "missing")
            ep, step = rec["episode_id"], rec["step_id"]
            if isinstance(ep, bool) or not isinstance(ep, (str, int)):
                raise DataError(*where, "episode_id", f"expected a string, got {ep!r}")
            if isinstance(step, bool) or not isinstance(step, int):
                raise DataError(*where, "step_id", f"expected an int, got {step!r}")
            key = (str(ep), step)
            if key in out:
                raise DataError(
                    *where, "step_id", f"episode {key[0]!r} step {step} already given on line {seen_at[key]}"
                )
            out[key] = prediction_to_action(rec["prediction"])
            seen_at[key] = n
    return out
