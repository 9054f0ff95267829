"""What a screen's annotations say: elements named unambiguously, their boxes, regions, containers, known
widget functions and the world's transitions — the facts every evolved answer is derived from."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ipl_jax.data.evolution.qa import MAX_ANSWER_CHARS
from ipl_jax.data.records import DataError, Step, UIElement

# Elements lying wholly above this line are the device status bar (clock, battery): never asked about.
STATUS_BAR_BOTTOM = 0.04
# Element centres above / below these lines are in the top bar / bottom bar; the rest is the main area.
TOP_BAR_BOTTOM = 0.15
BOTTOM_BAR_TOP = 0.85
# Two main-area elements whose centres are closer than this (screen heights) share a row.
ROW_GAP = 0.015
# Slack (screen fractions) when testing whether one box lies inside another.
CONTAIN_TOLERANCE = 0.005
# Names longer than this (paragraphs of OCR text) make poor questions and are skipped.
MAX_NAME_CHARS = 48

TEXT_KINDS = frozenset({"text", "label", "textview", "static_text"})

# Icon kinds (AITZ's ICON_* types) whose plain name is not just the words of the kind.
ICON_NOUNS = {
    "ICON_NAV_BAR_CIRCLE": "home button of the navigation bar",
    "ICON_NAV_BAR_RECT": "recent apps button",
    "ICON_V_BACKWARD": "back arrow",
    "ICON_V_FORWARD": "forward arrow",
    "ICON_THREE_DOTS": "three-dot menu",
    "ICON_THREE_BARS": "menu icon",
    "ICON_MAGNIFYING_GLASS": "search icon",
    "ICON_TAKE_PHOTO": "camera icon",
}

# Functions of widely used widgets, keyed by words of their kind or by their whole (lower-case) text. Only these
# and the world's own transitions are used, so that a function answer is never a guess.
FUNCTION_BY_WORD = {
    "home": "It returns to the home screen.",
    "nav_bar_circle": "It returns to the home screen.",
    "nav_bar_rect": "It shows the recently used apps.",
    "back": "It goes back to the previous screen.",
    "v_backward": "It goes back to the previous screen.",
    "search": "It opens the search.",
    "magnifying_glass": "It opens the search.",
    "settings": "It opens the settings.",
    "gear": "It opens the settings.",
    "plus": "It adds a new item.",
    "add": "It adds a new item.",
    "close": "It closes the current view.",
    "cancel": "It cancels and closes the current view.",
    "mic": "It starts voice input.",
    "microphone": "It starts voice input.",
    "share": "It shares the current item.",
    "three_dots": "It opens a menu with more options.",
    "three_bars": "It opens the navigation menu.",
    "menu": "It opens the menu.",
    "more": "It shows more options.",
    "send": "It sends the message.",
    "call": "It starts a phone call.",
    "delete": "It deletes the item.",
    "trash": "It deletes the item.",
    "camera": "It opens the camera.",
    "take_photo": "It takes a photo.",
    "save": "It saves the changes.",
    "done": "It confirms and finishes the current step.",
    "ok": "It confirms the choice.",
    "next": "It moves on to the next step.",
    "sign in": "It starts signing in.",
    "log in": "It starts logging in.",
    "add to cart": "It adds the item to the shopping cart.",
    "cart": "It opens the shopping cart.",
    "download": "It downloads the item.",
    "play": "It starts playback.",
    "pause": "It pauses playback.",
}

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def clean_text(text: str) -> str:
    return " ".join((text or "").split())


def kind_noun(kind: str) -> str:
    """A plain noun for an element kind: ``ICON_HOME`` → ``home icon``, ``button`` → ``button``."""
    k = (kind or "").strip()
    if k.upper() in ICON_NOUNS:
        return ICON_NOUNS[k.upper()]
    if k.upper().startswith("ICON_"):
        return k[5:].lower().replace("_", " ") + " icon"
    if not k:
        return "element"
    return k.lower().replace("_", " ")


def element_name(element: UIElement) -> str:
    """The name a question uses for an element: its text, or for a textless element the noun of its kind."""
    text = clean_text(element.text)
    return text if text else kind_noun(element.kind)


def element_ref(element: UIElement) -> str:
    """How a question refers to an element: ``"Wi-Fi"`` (quoted text) or ``the home icon``."""
    text = clean_text(element.text)
    return f'"{text}"' if text else f"the {kind_noun(element.kind)}"


def listed_name(element: UIElement) -> str:
    text = clean_text(element.text)
    return f'"{text}"' if text else kind_noun(element.kind)


def listable(element: UIElement) -> bool:
    """Worth naming in a page summary: elements with text, and icons (not bare rows, bars or images)."""
    return bool(clean_text(element.text)) or (element.kind or "").strip().upper().startswith("ICON")


def is_text_kind(kind: str) -> bool:
    return (kind or "").strip().lower() in TEXT_KINDS


def box_area(box) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def box_center(box) -> tuple[float, float]:
    return ((box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0)


def box_contains(outer, inner, tol: float = CONTAIN_TOLERANCE) -> bool:
    return (
        outer[0] - tol <= inner[0]
        and outer[1] - tol <= inner[1]
        and inner[2] <= outer[2] + tol
        and inner[3] <= outer[3] + tol
    )


def region_of(box) -> str:
    cy = box_center(box)[1]
    if cy < TOP_BAR_BOTTOM:
        return "top"
    if cy > BOTTOM_BAR_TOP:
        return "bottom"
    return "main"


def join_names(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def first_sentences(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """As many leading whole sentences of ``text`` as fit in ``limit`` characters ("" when not even one does)."""
    out = ""
    for sentence in _SENTENCE_END.split(clean_text(text)):
        candidate = (out + " " + sentence).strip()
        if len(candidate) > limit:
            break
        out = candidate
    return out


def step_label(step: Step) -> tuple[str, str]:
    return str(step.meta.get("file", "<steps>")), f"{step.episode_id}/{step.step_id}"


def usable_elements(step: Step) -> list[UIElement]:
    """The step's elements outside the status bar with a non-empty box, in reading order. Raises DataError for a box
    that is not four finite fractions in [0, 1] with x1 <= x2, y1 <= y2."""
    file, record = step_label(step)
    out = []
    for i, el in enumerate(step.elements):
        box = el.box
        if (
            len(box) != 4
            or any(not isinstance(v, (int, float)) or v != v for v in box)
            or any(v < -1e-6 or v > 1 + 1e-6 for v in box)
            or box[0] > box[2]
            or box[1] > box[3]
        ):
            raise DataError(
                file,
                record,
                f"elements[{i}].box",
                f"expected (x1, y1, x2, y2) fractions in [0, 1] with x1 <= x2, y1 <= y2; got {box!r}",
            )
        if box_area(box) <= 0 or box[3] <= STATUS_BAR_BOTTOM:
            continue
        out.append(el)
    out.sort(key=lambda e: (round(box_center(e.box)[1], 3), e.box[0]))
    return out


def referents(elements: Sequence[UIElement]) -> dict[str, UIElement]:
    """Names that pick out one element (at most MAX_NAME_CHARS), mapped to it; a name shared by nested elements
    refers to the outermost one.
    """
    groups: dict[str, list[UIElement]] = {}
    for el in elements:
        groups.setdefault(element_name(el).lower(), []).append(el)
    out = {}
    for els in groups.values():
        name = element_name(els[0])
        if len(name) > MAX_NAME_CHARS:
            continue
        outer = max(els, key=lambda e: box_area(e.box))
        if all(box_contains(outer.box, e.box) for e in els):
            out[name] = outer
    return out


def container_of(label: UIElement, elements: Sequence[UIElement]) -> UIElement | None:
    """The smallest non-text element strictly larger than ``label`` whose box holds it, if any."""
    best = None
    for el in elements:
        if el is label or is_text_kind(el.kind) or box_area(el.box) <= box_area(label.box) * 1.05:
            continue
        if box_contains(el.box, label.box) and (best is None or box_area(el.box) < box_area(best.box)):
            best = el
    return best


def transitions_of(step: Step) -> dict[str, str]:
    raw = step.meta.get("transitions")
    if raw is None:
        return {}
    file, record = step_label(step)
    if not isinstance(raw, dict):
        raise DataError(
            file, record, "meta.transitions", f"expected a dict element text -> effect, got {type(raw).__name__}"
        )
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise DataError(file, record, f"meta.transitions[{key!r}]", "keys and values must be strings")
        if clean_text(value):
            out[clean_text(key).lower()] = clean_text(value)
    return out


def known_function(element: UIElement) -> str | None:
    """The function of a widely used widget, or None (text words count only on a widget, never on bare text)."""
    text = clean_text(element.text).lower()
    if text in FUNCTION_BY_WORD and not is_text_kind(element.kind):
        return FUNCTION_BY_WORD[text]
    kind = (element.kind or "").strip().lower()
    if kind.startswith("icon_"):
        key = kind[5:]
        if key in FUNCTION_BY_WORD:
            return FUNCTION_BY_WORD[key]
        for word in key.split("_"):
            if word in FUNCTION_BY_WORD:
                return FUNCTION_BY_WORD[word]
    return None


def golden_target(step: Step, elements: Sequence[UIElement], names: dict[str, UIElement]) -> str | None:
    """The name of the element the golden click / long press lands on, if it has an unambiguous name."""
    action = step.action
    if action.type not in ("click", "long_press"):
        return None
    if action.target:
        for name in names:
            if name.lower() == clean_text(action.target).lower():
                return name
    if action.point is None:
        return None
    x, y = action.point
    hits = [e for e in elements if e.box[0] <= x <= e.box[2] and e.box[1] <= y <= e.box[3]]
    if not hits:
        return None
    smallest = min(hits, key=lambda e: box_area(e.box))
    name = element_name(smallest)
    return name if name in names and box_contains(names[name].box, smallest.box) else None
