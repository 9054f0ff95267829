"""Instruction evolution (method.md §10): question/answer pairs about a screen, built from its UI annotations.

Three levels, each a set of *kinds*:

* **Level I** — ``grounding`` ("Where is X?" → ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``), ``referring``
  ("What is at <box>?" → the element's text), ``page_description``.
* **Level II** — ``widget_function`` ("What does X do?") and ``nesting`` ("Which element does the label X belong
  to?", inferred from box containment).
* **Level III** — ``page_structure`` (top bar / main area / bottom bar from element positions),
  ``element_region`` ("In which part of the screen is X?") and ``what_happens`` ("What happens if I tap X?",
  answered from ``step.meta["transitions"]`` when present, else from the CoaT ``action_result`` of the golden
  click's target).

Every answer is derived from the annotations alone, so it is true of the screen as annotated; a question is only
asked about an element whose name picks it out unambiguously. Questions are drawn from paraphrase templates; the
choice is a pure function of ``(seed, episode_id, step_id)``, so a step's Q&A do not depend on which other steps
are evolved with it.

``filter_qas`` is the automatic counterpart of the paper's human filter (drops answers that justify a given action,
name several actions, are empty / too short / too long, duplicate another, or carry a malformed box).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import random
import re
import string
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from ipl_jax.coat.actions import BOX_END, BOX_START, format_grounding
from ipl_jax.data.records import DataError, Step, UIElement

LEVELS = (1, 2, 3)
KINDS_BY_LEVEL = {
    1: ("grounding", "referring", "page_description"),
    2: ("widget_function", "nesting"),
    3: ("page_structure", "element_region", "what_happens"),
}
LEVEL_OF_KIND = {kind: level for level, kinds in KINDS_BY_LEVEL.items() for kind in kinds}

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
# Answer length limits, shared by generation (which stays inside them) and the filter.
MIN_ANSWER_CHARS = 2
MAX_ANSWER_CHARS = 300
MAX_ANSWER_WORDS = 60

TEXT_KINDS = frozenset({"text", "label", "textview", "static_text"})


@dataclasses.dataclass(frozen=True)
class QA:
    """One question/answer pair about the screen of step ``(episode_id, step_id)``.

    ``level`` is 1, 2 or 3; ``kind`` names the question family (see ``KINDS_BY_LEVEL``); ``meta`` records where the
    answer came from (``source``: elements / coat / transitions / annotator), the element it is about
    (``target``: its name, ``box``: its box in screen fractions) and the template index.
    """

    episode_id: str
    step_id: int
    level: int
    kind: str
    question: str
    answer: str
    meta: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict:
        return {"episode_id": self.episode_id, "step_id": self.step_id, "level": self.level, "kind": self.kind,
                "question": self.question, "answer": self.answer, "meta": self.meta}


# ---------------------------------------------------------------------------------------------- templates

QUESTION_TEMPLATES = {
    "grounding": (
        "Where is {ref}?",
        "Locate {ref} on the screen.",
        "Give the box of {ref}.",
        "Find {ref} and answer with its box.",
        "Which part of the screenshot does {ref} occupy?",
        "Point out {ref}.",
    ),
    "referring": (
        "What is at {box}?",
        "What does the screen show inside {box}?",
        "Read the element at {box}.",
        "Which element lies in {box}?",
        "Name the element in {box}.",
    ),
    "page_description": (
        "Describe this page.",
        "What is on this screen?",
        "Give a short description of the current page.",
        "Summarise what this screen shows.",
        "What kind of page is this?",
    ),
    "widget_function": (
        "What does {ref} do?",
        "What is {ref} for?",
        "What is the function of {ref}?",
        "Why would I tap {ref}?",
        "Explain the purpose of {ref}.",
    ),
    "nesting": (
        'Which element does the label "{text}" belong to?',
        'The text "{text}" is part of which element?',
        'What contains the label "{text}"?',
        'Which larger element holds the text "{text}"?',
    ),
    "page_structure": (
        "How is this page laid out?",
        "Describe the structure of this screen.",
        "What are the main regions of this page?",
        "Outline the layout of the current screen.",
    ),
    "element_region": (
        "In which part of the screen is {ref}?",
        "Is {ref} in the top bar, the main area or the bottom bar?",
        "Which region of the page holds {ref}?",
    ),
    "what_happens": (
        "What happens if I tap {ref}?",
        "Where does tapping {ref} lead?",
        "What will I see after tapping {ref}?",
        "If I click {ref}, what happens?",
        "Predict the result of tapping {ref}.",
    ),
}

NESTING_ANSWERS = ("It belongs to {container}.", "It is part of {container}.", "{Container} holds it.")
REGION_ANSWERS = ("It is in {region}.", "In {region}.", "{Region}.")
REGION_NAMES = {"top": "the top bar", "main": "the main area", "bottom": "the bottom bar"}

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


# ---------------------------------------------------------------------------------------------- element helpers


def _clean(text: str) -> str:
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
    text = _clean(element.text)
    return text if text else kind_noun(element.kind)


def element_ref(element: UIElement) -> str:
    """How a question refers to an element: ``"Wi-Fi"`` (quoted text) or ``the home icon``."""
    text = _clean(element.text)
    return f'"{text}"' if text else f"the {kind_noun(element.kind)}"


def _listed(element: UIElement) -> str:
    text = _clean(element.text)
    return f'"{text}"' if text else kind_noun(element.kind)


def _listable(element: UIElement) -> bool:
    """Worth naming in a page summary: elements with text, and icons (not bare rows, bars or images)."""
    return bool(_clean(element.text)) or (element.kind or "").strip().upper().startswith("ICON")


def _is_text_kind(kind: str) -> bool:
    return (kind or "").strip().lower() in TEXT_KINDS


def _area(box) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _center(box) -> tuple[float, float]:
    return ((box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0)


def _contains(outer, inner, tol: float = CONTAIN_TOLERANCE) -> bool:
    return (outer[0] - tol <= inner[0] and outer[1] - tol <= inner[1]
            and inner[2] <= outer[2] + tol and inner[3] <= outer[3] + tol)


def _region(box) -> str:
    cy = _center(box)[1]
    if cy < TOP_BAR_BOTTOM:
        return "top"
    if cy > BOTTOM_BAR_TOP:
        return "bottom"
    return "main"


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _first_sentences(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """As many leading whole sentences of ``text`` as fit in ``limit`` characters ("" when not even one does)."""
    out = ""
    for sentence in _SENTENCE_END.split(_clean(text)):
        candidate = (out + " " + sentence).strip()
        if len(candidate) > limit:
            break
        out = candidate
    return out


def _step_label(step: Step) -> tuple[str, str]:
    return str(step.meta.get("file", "<steps>")), f"{step.episode_id}/{step.step_id}"


def usable_elements(step: Step) -> list[UIElement]:
    """The step's elements outside the status bar with a non-empty box, in reading order (top to bottom, left to
    right). Raises DataError for a box that is not four finite fractions in [0, 1] with x1 <= x2, y1 <= y2."""
    file, record = _step_label(step)
    out = []
    for i, el in enumerate(step.elements):
        box = el.box
        if (len(box) != 4 or any(not isinstance(v, (int, float)) or v != v for v in box)
                or any(v < -1e-6 or v > 1 + 1e-6 for v in box) or box[0] > box[2] or box[1] > box[3]):
            raise DataError(file, record, f"elements[{i}].box",
                            f"expected (x1, y1, x2, y2) fractions in [0, 1] with x1 <= x2, y1 <= y2; got {box!r}")
        if _area(box) <= 0 or box[3] <= STATUS_BAR_BOTTOM:
            continue
        out.append(el)
    out.sort(key=lambda e: (round(_center(e.box)[1], 3), e.box[0]))
    return out


def referents(elements: Sequence[UIElement]) -> dict[str, UIElement]:
    """Names that pick out one element, mapped to that element.

    A name shared by several elements still has a referent when they are nested one inside the next (a label inside
    its button): the outermost one, the thing a tap lands on. Names longer than MAX_NAME_CHARS are left out.
    """
    groups: dict[str, list[UIElement]] = {}
    for el in elements:
        groups.setdefault(element_name(el).lower(), []).append(el)
    out = {}
    for els in groups.values():
        name = element_name(els[0])
        if len(name) > MAX_NAME_CHARS:
            continue
        outer = max(els, key=lambda e: _area(e.box))
        if all(_contains(outer.box, e.box) for e in els):
            out[name] = outer
    return out


def _container_of(label: UIElement, elements: Sequence[UIElement]) -> Optional[UIElement]:
    """The smallest non-text element strictly larger than ``label`` whose box holds it, if any."""
    best = None
    for el in elements:
        if el is label or _is_text_kind(el.kind) or _area(el.box) <= _area(label.box) * 1.05:
            continue
        if _contains(el.box, label.box) and (best is None or _area(el.box) < _area(best.box)):
            best = el
    return best


def _transitions(step: Step) -> dict[str, str]:
    raw = step.meta.get("transitions")
    if raw is None:
        return {}
    file, record = _step_label(step)
    if not isinstance(raw, dict):
        raise DataError(file, record, "meta.transitions",
                        f"expected a dict element text -> effect, got {type(raw).__name__}")
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise DataError(file, record, f"meta.transitions[{key!r}]", "keys and values must be strings")
        if _clean(value):
            out[_clean(key).lower()] = _clean(value)
    return out


def _known_function(element: UIElement) -> Optional[str]:
    """The function of a widely used widget, or None. Words of a text are only trusted on a widget (a button, an
    icon), never on a bare text element: a page title "Settings" does not open the settings."""
    text = _clean(element.text).lower()
    if text in FUNCTION_BY_WORD and not _is_text_kind(element.kind):
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


def _golden_target(step: Step, elements: Sequence[UIElement], names: dict[str, UIElement]) -> Optional[str]:
    """The name of the element the golden click / long press lands on, if it has an unambiguous name."""
    action = step.action
    if action.type not in ("click", "long_press"):
        return None
    if action.target:
        for name in names:
            if name.lower() == _clean(action.target).lower():
                return name
    if action.point is None:
        return None
    x, y = action.point
    hits = [e for e in elements if e.box[0] <= x <= e.box[2] and e.box[1] <= y <= e.box[3]]
    if not hits:
        return None
    smallest = min(hits, key=lambda e: _area(e.box))
    name = element_name(smallest)
    return name if name in names and _contains(names[name].box, smallest.box) else None


# ---------------------------------------------------------------------------------------------- generation


def _step_rng(seed: int, step: Step, purpose: str) -> random.Random:
    key = f"{int(seed)}\x00{step.episode_id}\x00{step.step_id}\x00{purpose}"
    digest = hashlib.sha256(key.encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class _Maker:
    """Builds one step's candidate Q&A, choosing templates with the step's own RNG."""

    def __init__(self, step: Step, rng: random.Random):
        self.step, self.rng = step, rng
        self.elements = usable_elements(step)
        self.names = referents(self.elements)
        self.transitions = _transitions(step)

    def effect_of(self, element: UIElement) -> Optional[str]:
        """What tapping ``element`` does per the world's transitions, looked up by its text, then by its kind."""
        for key in (_clean(element.text).lower(), (element.kind or "").strip().lower()):
            if key and key in self.transitions:
                return self.transitions[key]
        return None

    def qa(self, kind: str, template_args: dict, answer: str, **meta) -> QA:
        templates = QUESTION_TEMPLATES[kind]
        t = self.rng.randrange(len(templates))
        return QA(self.step.episode_id, self.step.step_id, LEVEL_OF_KIND[kind], kind,
                  templates[t].format(**template_args), answer, {"template": t, **meta})

    @staticmethod
    def _el_meta(name: str, el: UIElement, source: str = "elements") -> dict:
        return {"source": source, "target": name, "box": [float(v) for v in el.box]}

    # Level I
    def grounding(self) -> list[QA]:
        return [self.qa("grounding", {"ref": element_ref(el)}, format_grounding(el.box), **self._el_meta(name, el))
                for name, el in self.names.items()]

    def referring(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            if len(name) < MIN_ANSWER_CHARS:
                continue
            answer = name if _clean(el.text) else f"The {name}."
            out.append(self.qa("referring", {"box": format_grounding(el.box)}, answer, **self._el_meta(name, el)))
        return out

    def page_description(self) -> list[QA]:
        coat = self.step.coat
        if coat is not None and _first_sentences(coat.screen_desc):
            return [self.qa("page_description", {}, _first_sentences(coat.screen_desc), source="coat")]
        top_texts = [el for el in self.elements if _region(el.box) == "top" and _clean(el.text)]
        title = top_texts[0] if top_texts else None
        shown = [element_ref(el) for el in self.names.values() if _listable(el) and el != title][:4]
        if title is not None and len(_clean(title.text)) <= MAX_NAME_CHARS:
            answer = f'The top bar reads "{_clean(title.text)}".'
            if shown:
                answer += f" The page shows {_join(shown)}."
        elif shown:
            answer = f"The page shows {_join(shown)}."
        else:
            return []
        return [self.qa("page_description", {}, answer, source="elements")]

    # Level II
    def widget_function(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            answer, source = _known_function(el), "elements"
            if answer is None and self.effect_of(el) is not None:
                answer, source = self.effect_of(el), "transitions"
            if answer is not None:
                out.append(self.qa("widget_function", {"ref": element_ref(el)}, answer,
                                   **self._el_meta(name, el, source)))
        return out

    def nesting(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            # The label is the innermost text element of that name; `el` may be its container already.
            labels = [e for e in self.elements if element_name(e) == name and _is_text_kind(e.kind)]
            if not labels:
                continue
            label = min(labels, key=lambda e: _area(e.box))
            container = _container_of(label, self.elements)
            if container is None:
                continue
            noun = kind_noun(container.kind)
            ctext = _clean(container.text)
            if ctext and ctext.lower() != name.lower():
                desc = f'the "{ctext}" {noun}'
            else:
                desc = f"the {noun} at {format_grounding(container.box)}"
            a = self.rng.choice(NESTING_ANSWERS)
            answer = a.format(container=desc, Container=desc[0].upper() + desc[1:])
            out.append(self.qa("nesting", {"text": name}, answer, source="elements", target=name,
                               box=[float(v) for v in label.box],
                               container_box=[float(v) for v in container.box]))
        return out

    # Level III
    def page_structure(self) -> list[QA]:
        if len(self.elements) < 2:
            return []
        by_region = {"top": [], "main": [], "bottom": []}
        for el in self.elements:
            by_region[_region(el.box)].append(el)

        def names_of(els, k=3):
            seen, out = set(), []
            for e in els:
                if not _listable(e):
                    continue
                n = _listed(e)
                if n.lower() not in seen and len(n) <= MAX_NAME_CHARS + 2:
                    seen.add(n.lower())
                    out.append(n)
            return out[:k]

        parts = []
        if names_of(by_region["top"]):
            parts.append(f"Top bar: {_join(names_of(by_region['top']))}.")
        main = by_region["main"]
        if main:
            rows: list[list[UIElement]] = []
            for el in main:  # already in reading order
                if rows and _center(el.box)[1] - _center(rows[-1][0].box)[1] <= ROW_GAP:
                    rows[-1].append(el)
                else:
                    rows.append([el])
            firsts = [min(r, key=lambda e: (not _clean(e.text), _area(e.box))) for r in rows]
            if len(rows) >= 3 and names_of(firsts):
                parts.append(f"Main area: {len(rows)} rows, starting with {_join(names_of(firsts))}.")
            elif names_of(main):
                parts.append(f"Main area: {_join(names_of(main))}.")
        if names_of(by_region["bottom"]):
            parts.append(f"Bottom bar: {_join(names_of(by_region['bottom']))}.")
        if not parts:
            return []
        answer = " ".join(parts)
        if len(answer) > MAX_ANSWER_CHARS:
            return []
        return [self.qa("page_structure", {}, answer, source="elements")]

    def element_region(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            region = REGION_NAMES[_region(el.box)]
            a = self.rng.choice(REGION_ANSWERS)
            answer = a.format(region=region, Region=region[0].upper() + region[1:])
            out.append(self.qa("element_region", {"ref": element_ref(el)}, answer, **self._el_meta(name, el)))
        return out

    def what_happens(self) -> list[QA]:
        out = []
        if self.transitions:
            for name, el in self.names.items():
                effect = self.effect_of(el)
                if effect:
                    out.append(self.qa("what_happens", {"ref": element_ref(el)}, effect,
                                       **self._el_meta(name, el, "transitions")))
            return out
        coat = self.step.coat
        result = _first_sentences(coat.action_result) if coat is not None else ""
        name = _golden_target(self.step, self.elements, self.names) if result else None
        if name is not None:
            el = self.names[name]
            out.append(self.qa("what_happens", {"ref": element_ref(el)}, result, **self._el_meta(name, el, "coat")))
        return out


def candidate_qas(step: Step, seed: int, levels: Iterable[int] = LEVELS) -> dict[str, list[QA]]:
    """Every Q&A the annotations of ``step`` support at ``levels``, grouped by kind (kinds in level order)."""
    maker = _Maker(step, _step_rng(seed, step, "templates"))
    out = {}
    for level in sorted(set(levels)):
        for kind in KINDS_BY_LEVEL[level]:
            out[kind] = getattr(maker, kind)()
    return out


def evolve_step(step: Step, seed: int, levels: Iterable[int] = LEVELS, per_step: int = 8) -> list[QA]:
    """At most ``per_step`` Q&A for one step, spread over the kinds: kinds are visited in an order drawn from the
    step's RNG, one Q&A of each kind per pass, until ``per_step`` are taken or every kind is used up."""
    levels = tuple(levels)
    if not levels or any(level not in LEVELS for level in levels):
        raise ValueError(f"evolve_step: levels must be a non-empty subset of {LEVELS}, got {levels!r}")
    if int(per_step) < 1:
        raise ValueError(f"evolve_step: per_step must be >= 1, got {per_step!r}")
    pools = {k: v for k, v in candidate_qas(step, seed, levels).items() if v}
    rng = _step_rng(seed, step, "selection")
    for pool in pools.values():
        rng.shuffle(pool)
    order = list(pools)
    rng.shuffle(order)
    taken: list[QA] = []
    while len(taken) < per_step and any(pools.values()):
        for kind in order:
            if pools[kind] and len(taken) < per_step:
                taken.append(pools[kind].pop())
    return taken


def evolve_steps(steps: Iterable[Step], seed: int, levels: Iterable[int] = LEVELS, per_step: int = 8) -> list[QA]:
    """Q&A for every step (see ``evolve_step``), in step order. Deterministic given ``seed``."""
    levels = tuple(levels)
    out: list[QA] = []
    for step in steps:
        out.extend(evolve_step(step, seed, levels, per_step))
    return out


# ---------------------------------------------------------------------------------------------- JSONL


def write_qas_jsonl(path: Union[str, Path], qas: Iterable[QA]) -> int:
    """Write one JSON object per line; returns the number written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for qa in qas:
            f.write(json.dumps(qa.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


_QA_FIELDS = {"episode_id": str, "step_id": int, "level": int, "kind": str, "question": str, "answer": str}


def read_qas_jsonl(path: Union[str, Path]) -> list[QA]:
    """Read a file written by ``write_qas_jsonl``. A malformed line raises DataError naming the line and field."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = f"line {line_no}"
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(path, record, "<json>", f"not valid JSON: {e.msg}") from None
            if not isinstance(d, dict):
                raise DataError(path, record, "<json>", "expected a JSON object")
            for field, typ in _QA_FIELDS.items():
                if field not in d:
                    raise DataError(path, record, field, "missing")
                if not isinstance(d[field], typ) or (typ is int and isinstance(d[field], bool)):
                    raise DataError(path, record, field, f"expected {typ.__name__}, got {type(d[field]).__name__}")
            if d["level"] not in LEVELS:
                raise DataError(path, record, "level", f"expected one of {LEVELS}, got {d['level']}")
            meta = d.get("meta", {})
            if not isinstance(meta, dict):
                raise DataError(path, record, "meta", "expected a JSON object")
            out.append(QA(d["episode_id"], d["step_id"], d["level"], d["kind"], d["question"], d["answer"], meta))
    return out


# ---------------------------------------------------------------------------------------------- filter

FILTER_REASONS = ("empty", "bad_box", "justifies_action", "multiple_actions", "too_short", "too_long",
                  "duplicate", "near_duplicate")

# Phrases with which an annotator justifies the action it was handed instead of reading the screen.
_JUSTIFY_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"\bsince\b[^.]{0,80}\bnext action\b",
    r"\bmatch(?:es|ed|ing)?\s+(?:with\s+)?the\s+annotat",
    r"\b(?:the|this|given|provided)\s+annotation\b",
    r"\baccording to the annotat",
    r"\bannotated (?:next )?action\b",
    r"\bas the next action is\b",
    r"\b(?:provided|given|golden|ground[- ]truth|required)\s+(?:next\s+)?action\b",
    r"\bthe next action is\b[^.]{0,80}\b(?:therefore|so|thus)\b",
    r"\btherefore,?\s+the next action\b",
)]

_ACTION_VERB = (r"(?:click(?:s|ed|ing)?|tap(?:s|ped|ping)?|scroll(?:s|ed|ing)?|swip(?:e|es|ed|ing)|"
                r"long[- ]press(?:es|ed|ing)?|press(?:es|ed|ing)?|typ(?:e|es|ed|ing)|input(?:s|ting)?)")
# Two actions offered as alternatives inside one sentence: "tap Search or scroll down", "swiping up or scrolling
# down", "Alternatively, press back".
_MULTI_ACTION_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"\b" + _ACTION_VERB + r"\b[^.!?]{0,80}?\b(?:or|and/or|alternatively|otherwise)\b[^.!?]{0,40}?\b"
    + _ACTION_VERB + r"\b",
    r"\balternatively\b[^.!?]{0,40}\b" + _ACTION_VERB + r"\b",
)]

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BOX_TEXT = re.compile(r"\(" + _NUM + "," + _NUM + r"\)\s*,?\s*\(" + _NUM + "," + _NUM + r"\)")
_BOX_SPAN = re.compile(re.escape(BOX_START) + r"(.*?)" + re.escape(BOX_END), re.DOTALL)


def _box_ok(text: str) -> bool:
    m = _BOX_TEXT.fullmatch(text.strip())
    if m is None:
        return False
    x1, y1, x2, y2 = (float(g) for g in m.groups())
    return all(0 <= v <= 1000 for v in (x1, y1, x2, y2)) and x1 <= x2 and y1 <= y2


def boxes_valid(qa: QA) -> bool:
    """True when every box in the answer parses with coordinates in 0..1000 (x1 <= x2, y1 <= y2), the box tokens
    are balanced, and a grounding answer holds at least one box."""
    a = qa.answer
    if a.count(BOX_START) != a.count(BOX_END):
        return False
    spans = _BOX_SPAN.findall(a)
    if len(spans) != a.count(BOX_START):
        return False
    if qa.kind == "grounding":
        if not spans:  # an annotator may write the box without the tokens
            m = _BOX_TEXT.search(a)
            return m is not None and _box_ok(m.group(0))
    return all(_box_ok(s) for s in spans)


def normalise_text(text: str) -> str:
    """Lower case, punctuation removed (box digits kept), articles dropped, whitespace collapsed."""
    t = text.lower().replace(BOX_START, " ").replace(BOX_END, " ")
    t = t.translate(str.maketrans({c: " " for c in string.punctuation}))
    return " ".join(w for w in t.split() if w not in ("a", "an", "the"))


def drop_reason(qa: QA, *, min_answer_chars: int = MIN_ANSWER_CHARS, max_answer_chars: int = MAX_ANSWER_CHARS,
                max_answer_words: int = MAX_ANSWER_WORDS) -> Optional[str]:
    """Why one Q&A should be dropped, judged on its own (duplicates need the others: see ``filter_qas``)."""
    q, a = _clean(qa.question), _clean(qa.answer)
    if not q or not a:
        return "empty"
    if qa.kind == "grounding" or BOX_START in a or BOX_END in a:
        if not boxes_valid(qa):
            return "bad_box"
    if any(p.search(a) for p in _JUSTIFY_PATTERNS):
        return "justifies_action"
    if any(p.search(a) for p in _MULTI_ACTION_PATTERNS):
        return "multiple_actions"
    if len(a) < min_answer_chars or not any(c.isalnum() for c in a):
        return "too_short"
    if len(a) > max_answer_chars or len(a.split()) > max_answer_words:
        return "too_long"
    return None


def filter_qas(qas: Iterable[QA], *, near_duplicate_ratio: float = 0.92, **limits) -> tuple[list[QA], dict[str, int]]:
    """Keep the Q&A that pass ``drop_reason`` and are not duplicates; returns ``(kept, counts)``.

    ``counts`` has one entry per reason in FILTER_REASONS (0 when nothing was dropped for it) plus ``kept``.
    Duplicates are judged per screen (``episode_id``, ``step_id``), the first one kept: ``duplicate`` when the
    question and answer are identical up to surrounding whitespace; ``near_duplicate`` when the normalised
    questions are equal (the same question asked twice, whatever the answers), or when the normalised answers are
    equal and the normalised questions are at least ``near_duplicate_ratio`` similar (difflib).
    """
    counts = {reason: 0 for reason in FILTER_REASONS}
    kept: list[QA] = []
    seen: dict[tuple[str, int], list[tuple[str, str, str, str]]] = {}
    for qa in qas:
        reason = drop_reason(qa, **limits)
        if reason is None:
            exact = (qa.question.strip(), qa.answer.strip())
            nq, na = normalise_text(qa.question), normalise_text(qa.answer)
            for eq, ea, oq, oa in seen.get((qa.episode_id, qa.step_id), []):
                if (eq, ea) == exact:
                    reason = "duplicate"
                    break
                if nq == oq or (na == oa and difflib.SequenceMatcher(None, nq, oq).ratio() >= near_duplicate_ratio):
                    reason = "near_duplicate"
                    break
        if reason is not None:
            counts[reason] += 1
            continue
        seen.setdefault((qa.episode_id, qa.step_id), []).append((*exact, nq, na))
        kept.append(qa)
    counts["kept"] = len(kept)
    return kept, counts
