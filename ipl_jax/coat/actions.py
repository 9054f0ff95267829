"""The action space, and the text forms an agent reads and writes.

Points and boxes are screen fractions; ``scroll.direction`` is the finger's. s3 texts: ``click <target>``,
``type "<text>"``, ``scroll up``, ``press back``, ``stop``, ...; s4: ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``
in 0..1000. Parsing never raises nor evaluates model text: failures give type ``"invalid"``.
"""

from __future__ import annotations

import dataclasses
import re

ACTION_TYPES = ("click", "long_press", "type", "scroll", "press", "stop", "open_app", "wait")
# The five types of the CoaT action turn, in the order used by metric tables.
CORE_TYPES = ("click", "type", "scroll", "press", "stop")
DIRECTIONS = ("up", "down", "left", "right")
BUTTONS = ("back", "home", "enter")
INVALID = "invalid"

BOX_START = "<|box_start|>"
BOX_END = "<|box_end|>"


@dataclasses.dataclass(frozen=True)
class Action:
    """One GUI action in normalised form."""

    type: str
    point: tuple[float, float] | None = None
    box: tuple[float, float, float, float] | None = None
    text: str | None = None
    direction: str | None = None
    button: str | None = None
    target: str | None = None
    status: str | None = None  # for stop: "complete" (default) or "impossible"
    parsed: bool = True

    def to_json(self) -> dict:
        """A JSON-ready dict holding only the fields that are set."""
        out = {"type": self.type}
        for f in ("point", "box", "text", "direction", "button", "target", "status"):
            v = getattr(self, f)
            if v is not None:
                out[f] = list(v) if isinstance(v, tuple) else v
        if not self.parsed:
            out["parsed"] = False
        return out

    @staticmethod
    def from_json(d: dict) -> Action:
        kw = dict(d)
        for f in ("point", "box"):
            if kw.get(f) is not None:
                kw[f] = tuple(float(v) for v in kw[f])
        return Action(**kw)


def invalid_action() -> Action:
    return Action(type=INVALID, parsed=False)


def box_center(box: tuple[float, float, float, float]) -> tuple[float, float]:
    x1, y1, x2, y2 = box
    return ((x1 + x2) / 2.0, (y1 + y2) / 2.0)


# ---------------------------------------------------------------------------------------------- formatting


def _quote(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def format_action(action: Action) -> str:
    """The CoaT action-turn text (s3) of an action."""
    t = action.type
    if t in ("click", "long_press"):
        target = (action.target or "").strip() or "the element"
        return f"{t} {target}"
    if t == "type":
        return f"type {_quote(action.text or '')}"
    if t == "scroll":
        return f"scroll {action.direction}"
    if t == "press":
        return f"press {action.button}"
    if t == "stop":
        return "stop"
    if t == "open_app":
        return f"open_app {_quote(action.text or '')}"
    if t == "wait":
        return "wait"
    raise ValueError(f"format_action: unknown action type {t!r}")


def to_relative(v: float) -> int:
    """A screen fraction in [0, 1] as an integer in 0..1000."""
    return int(min(1000, max(0, round(float(v) * 1000))))


def format_grounding(box: tuple[float, float, float, float]) -> str:
    """The grounding-turn text (s4) for a box given in screen fractions."""
    x1, y1, x2, y2 = (to_relative(v) for v in box)
    return f"{BOX_START}({x1},{y1}),({x2},{y2}){BOX_END}"


# ---------------------------------------------------------------------------------------------- parsing

_PREFIX = re.compile(r"^\s*(?:(?:the\s+)?(?:next\s+)?action\s*(?:is)?\s*[:\-]?\s*)", re.IGNORECASE)
_QUOTED = re.compile(r"""^\s*["“'](.*?)["”']?\s*$""", re.DOTALL)
_INT = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BOX = re.compile(r"\(" + _INT + "," + _INT + r"\)\s*,?\s*\(" + _INT + "," + _INT + r"\)")
_POINT = re.compile(r"\(" + _INT + "," + _INT + r"\)")
_TYPE_ALIASES = {
    "click": "click",
    "tap": "click",
    "long_press": "long_press",
    "long-press": "long_press",
    "type": "type",
    "input": "type",
    "scroll": "scroll",
    "swipe": "scroll",
    "press": "press",
    "stop": "stop",
    "open_app": "open_app",
    "wait": "wait",
}


def _unquote(s: str) -> str | None:
    m = _QUOTED.match(s)
    if m is None:
        return None
    return m.group(1)


def parse_action_text(text: str) -> Action:
    """Parse an action-turn text (s3) into an Action without a point. Never raises."""
    if not isinstance(text, str):
        return invalid_action()
    s = text.strip().splitlines()[0] if text.strip() else ""
    s = _PREFIX.sub("", s).strip().rstrip(".").strip()
    m = re.match(r"^([A-Za-z_\-]+)\b\s*(.*)$", s, re.DOTALL)
    if m is None:
        return invalid_action()
    kind = _TYPE_ALIASES.get(m.group(1).lower())
    rest = m.group(2).strip()
    if kind is None:
        return invalid_action()
    if kind in ("click", "long_press"):
        if not rest:
            return invalid_action()
        return Action(type=kind, target=rest)
    if kind == "type":
        body = _unquote(rest)
        if body is None:
            return invalid_action()
        return Action(type="type", text=body)
    if kind == "open_app":
        body = _unquote(rest)
        body = rest if body is None else body
        if not body:
            return invalid_action()
        return Action(type="open_app", text=body)
    if kind == "scroll":
        d = rest.lower().split()[0] if rest else ""
        if d not in DIRECTIONS:
            return invalid_action()
        return Action(type="scroll", direction=d)
    if kind == "press":
        b = rest.lower().split()[0] if rest else ""
        if b not in BUTTONS:
            return invalid_action()
        return Action(type="press", button=b)
    if kind in ("stop", "wait"):
        return Action(type=kind)
    return invalid_action()


def parse_grounding(text: str) -> tuple[float, float, float, float] | None:
    """Parse a grounding-turn text (s4) into a box in screen fractions, or None. Never raises.

    Accepts ``(x1,y1),(x2,y2)`` in 0..1000 with or without box tokens, or a point ``(x,y)`` (a degenerate box).
    """
    if not isinstance(text, str):
        return None
    m = _BOX.search(text)
    if m is not None:
        vals = [float(g) for g in m.groups()]
    else:
        m = _POINT.search(text)
        if m is None:
            return None
        x, y = float(m.group(1)), float(m.group(2))
        vals = [x, y, x, y]
    if any(v < 0 or v > 1000 for v in vals):
        return None
    x1, y1, x2, y2 = (v / 1000.0 for v in vals)
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def parse_action(action_text: str, grounding_text: str | None = None) -> Action:
    """Parse the action turn and, for click / long_press, the grounding turn. Never raises.
    A click whose grounding does not parse keeps its type but has no point.
    """
    a = parse_action_text(action_text)
    if a.type in ("click", "long_press") and grounding_text is not None:
        box = parse_grounding(grounding_text)
        if box is not None:
            a = dataclasses.replace(a, box=box, point=box_center(box))
    return a


def needs_grounding(action: Action) -> bool:
    return action.type in ("click", "long_press")


_STOP_WORDS = ("stop", "complete", "done", "finish", "finished")


def thought_names_action(thought: str, action: Action) -> bool:
    """Whether a thought names ``action`` (its target, typed text, direction, button, app, or a finishing word for
    stop), case-insensitively: a textual test, not a decision."""
    text = " ".join(str(thought).lower().split())
    words = set(text.replace(".", " ").replace(",", " ").replace(";", " ").split())
    t = action.type
    if t in ("click", "long_press"):
        target = " ".join((action.target or "").lower().split())
        return bool(target) and target in text
    if t in ("type", "open_app"):
        arg = " ".join((action.text or "").lower().split())
        return bool(arg) and arg in text
    if t == "scroll":
        return bool(action.direction) and action.direction.lower() in words
    if t == "press":
        return bool(action.button) and action.button.lower() in words
    if t == "stop":
        return any(w in words for w in _STOP_WORDS)
    if t == "wait":
        return "wait" in words
    return False
