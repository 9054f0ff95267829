"""Our actions <-> AndroidWorld's JSON actions (``android_world/env/json_action.py``), both ways.

Ours hold points as screen fractions and ``scroll.direction`` as the finger's; AndroidWorld's hold ``x``, ``y`` as
absolute screen pixels and ``scroll.direction`` as the way the view moves (its ``scroll down`` drags the finger up),
while its ``swipe.direction`` is the finger's. The table and what has no counterpart: docs/formats.md
(AndroidWorld actions).
"""

from __future__ import annotations

import math

from ipl_jax.coat.actions import Action, box_center, invalid_action

UNKNOWN = "unknown"
# our finger direction -> AndroidWorld's scroll direction (the view's), and back: each axis reversed
SCROLL_OF_FINGER = {"up": "down", "down": "up", "left": "right", "right": "left"}
FINGER_OF_SCROLL = {v: k for k, v in SCROLL_OF_FINGER.items()}
_PRESS = {"back": "navigate_back", "home": "navigate_home", "enter": "keyboard_enter"}
_BUTTON = {v: k for k, v in _PRESS.items()}
_STATUS = {"complete": "complete", "impossible": "infeasible"}


def to_pixel(fx: float, fy: float, screen_size: tuple[int, int]) -> tuple[int, int]:
    """The pixel (column, row) holding the point at fractions (fx, fy) of a (width, height) screen."""
    w, h = screen_size
    return (min(w - 1, max(0, int(math.floor(fx * w)))), min(h - 1, max(0, int(math.floor(fy * h)))))


def to_fraction(x: int, y: int, screen_size: tuple[int, int]) -> tuple[float, float]:
    """The centre of pixel (x, y) as screen fractions (so ``to_pixel(*to_fraction(x, y))`` is (x, y))."""
    w, h = screen_size
    return ((int(x) + 0.5) / w, (int(y) + 0.5) / h)


def _point(action: Action) -> tuple[float, float] | None:
    point = action.point if action.point is not None else (box_center(action.box) if action.box else None)
    if point is None:
        return None
    try:
        fx, fy = (float(v) for v in point)
    except (TypeError, ValueError):
        return None
    return (fx, fy) if math.isfinite(fx) and math.isfinite(fy) else None


def to_json_action(action: Action, screen_size: tuple[int, int]) -> dict:
    """AndroidWorld's JSON action for ``action`` on a (width, height) pixel screen. What cannot be played (an
    invalid action, a click without a point, an unknown button) becomes ``{"action_type": "unknown"}``, which the
    device ignores, as the synthetic world ignores it."""
    t = action.type
    if t in ("click", "long_press"):
        point = _point(action)
        if point is None:
            return {"action_type": UNKNOWN}
        x, y = to_pixel(*point, screen_size)
        return {"action_type": t, "x": x, "y": y}
    if t == "type":
        out = {"action_type": "input_text", "text": action.text or ""}
        point = _point(action)
        if point is not None:
            out["x"], out["y"] = to_pixel(*point, screen_size)
        return out
    if t == "scroll" and action.direction in SCROLL_OF_FINGER:
        return {"action_type": "scroll", "direction": SCROLL_OF_FINGER[action.direction]}
    if t == "press" and action.button in _PRESS:
        return {"action_type": _PRESS[action.button]}
    if t == "stop":
        return {"action_type": "status", "goal_status": _STATUS.get(action.status or "complete", "complete")}
    if t == "open_app" and action.text:
        return {"action_type": "open_app", "app_name": action.text}
    if t == "wait":
        return {"action_type": "wait"}
    return {"action_type": UNKNOWN}


def from_json_action(d: dict, screen_size: tuple[int, int]) -> Action:
    """Our action for AndroidWorld's JSON action ``d`` (logs, tests, the test server). ``double_tap`` reads as a
    click, ``swipe`` as a scroll with its (finger) direction; what has no counterpart here (``answer``, an
    element ``index``, ``unknown``, a malformed action) is invalid, keeping ``text`` where there is one."""
    t = d.get("action_type")
    if d.get("index") is not None and t != "scroll":
        return invalid_action()
    xy = (d.get("x"), d.get("y"))
    has_xy = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xy)
    if t in ("click", "double_tap", "long_press"):
        if not has_xy:
            return invalid_action()
        return Action(type="long_press" if t == "long_press" else "click", point=to_fraction(*xy, screen_size))
    if t == "input_text":
        point = to_fraction(*xy, screen_size) if has_xy else None
        return Action(type="type", text=str(d.get("text") or ""), point=point)
    if t == "scroll" and d.get("direction") in FINGER_OF_SCROLL and not d.get("index"):
        return Action(type="scroll", direction=FINGER_OF_SCROLL[d["direction"]])
    if t == "swipe" and d.get("direction") in SCROLL_OF_FINGER:
        return Action(type="scroll", direction=d["direction"])
    if t in _BUTTON:
        return Action(type="press", button=_BUTTON[t])
    if t == "status":
        return Action(type="stop", status="impossible" if d.get("goal_status") == "infeasible" else "complete")
    if t == "open_app" and d.get("app_name"):
        return Action(type="open_app", text=str(d["app_name"]))
    if t == "wait":
        return Action(type="wait")
    text = d.get("text")
    return Action(type="invalid", text=str(text) if text is not None else None, parsed=False)
