"""Generating a step's Q&A: paraphrase templates chosen with the step's own RNG, one generator per kind, and
the per-step selection spread over the kinds."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

from ipl_jax.coat.actions import format_grounding
from ipl_jax.data.evolution.qa import KINDS_BY_LEVEL, LEVEL_OF_KIND, LEVELS, MAX_ANSWER_CHARS, MIN_ANSWER_CHARS, QA
from ipl_jax.data.evolution.screen import (
    MAX_NAME_CHARS,
    ROW_GAP,
    box_area,
    box_center,
    clean_text,
    container_of,
    element_name,
    element_ref,
    first_sentences,
    golden_target,
    is_text_kind,
    join_names,
    kind_noun,
    known_function,
    listable,
    listed_name,
    referents,
    region_of,
    transitions_of,
    usable_elements,
)
from ipl_jax.data.records import Step, UIElement

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
        self.transitions = transitions_of(step)

    def effect_of(self, element: UIElement) -> str | None:
        """What tapping ``element`` does per the world's transitions, looked up by its text, then by its kind."""
        for key in (clean_text(element.text).lower(), (element.kind or "").strip().lower()):
            if key and key in self.transitions:
                return self.transitions[key]
        return None

    def qa(self, kind: str, template_args: dict, answer: str, **meta) -> QA:
        templates = QUESTION_TEMPLATES[kind]
        t = self.rng.randrange(len(templates))
        return QA(
            self.step.episode_id,
            self.step.step_id,
            LEVEL_OF_KIND[kind],
            kind,
            templates[t].format(**template_args),
            answer,
            {"template": t, **meta},
        )

    @staticmethod
    def _el_meta(name: str, el: UIElement, source: str = "elements") -> dict:
        return {"source": source, "target": name, "box": [float(v) for v in el.box]}

    # Level I
    def grounding(self) -> list[QA]:
        return [
            self.qa("grounding", {"ref": element_ref(el)}, format_grounding(el.box), **self._el_meta(name, el))
            for name, el in self.names.items()
        ]

    def referring(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            if len(name) < MIN_ANSWER_CHARS:
                continue
            answer = name if clean_text(el.text) else f"The {name}."
            out.append(self.qa("referring", {"box": format_grounding(el.box)}, answer, **self._el_meta(name, el)))
        return out

    def page_description(self) -> list[QA]:
        coat = self.step.coat
        if coat is not None and first_sentences(coat.screen_desc):
            return [self.qa("page_description", {}, first_sentences(coat.screen_desc), source="coat")]
        top_texts = [el for el in self.elements if region_of(el.box) == "top" and clean_text(el.text)]
        title = top_texts[0] if top_texts else None
        shown = [element_ref(el) for el in self.names.values() if listable(el) and el != title][:4]
        if title is not None and len(clean_text(title.text)) <= MAX_NAME_CHARS:
            answer = f'The top bar reads "{clean_text(title.text)}".'
            if shown:
                answer += f" The page shows {join_names(shown)}."
        elif shown:
            answer = f"The page shows {join_names(shown)}."
        else:
            return []
        return [self.qa("page_description", {}, answer, source="elements")]

    # Level II
    def widget_function(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            answer, source = known_function(el), "elements"
            if answer is None and self.effect_of(el) is not None:
                answer, source = self.effect_of(el), "transitions"
            if answer is not None:
                out.append(
                    self.qa("widget_function", {"ref": element_ref(el)}, answer, **self._el_meta(name, el, source))
                )
        return out

    def nesting(self) -> list[QA]:
        out = []
        for name in self.names:
            # The label is the innermost text element of that name (the named element may be its container).
            labels = [e for e in self.elements if element_name(e) == name and is_text_kind(e.kind)]
            if not labels:
                continue
            label = min(labels, key=lambda e: box_area(e.box))
            container = container_of(label, self.elements)
            if container is None:
                continue
            noun = kind_noun(container.kind)
            ctext = clean_text(container.text)
            if ctext and ctext.lower() != name.lower():
                desc = f'the "{ctext}" {noun}'
            else:
                desc = f"the {noun} at {format_grounding(container.box)}"
            a = self.rng.choice(NESTING_ANSWERS)
            answer = a.format(container=desc, Container=desc[0].upper() + desc[1:])
            out.append(
                self.qa(
                    "nesting",
                    {"text": name},
                    answer,
                    source="elements",
                    target=name,
                    box=[float(v) for v in label.box],
                    container_box=[float(v) for v in container.box],
                )
            )
        return out

    # Level III
    def page_structure(self) -> list[QA]:
        if len(self.elements) < 2:
            return []
        by_region = {"top": [], "main": [], "bottom": []}
        for el in self.elements:
            by_region[region_of(el.box)].append(el)

        def names_of(els, k=3):
            seen, out = set(), []
            for e in els:
                if not listable(e):
                    continue
                n = listed_name(e)
                if n.lower() not in seen and len(n) <= MAX_NAME_CHARS + 2:
                    seen.add(n.lower())
                    out.append(n)
            return out[:k]

        parts = []
        if names_of(by_region["top"]):
            parts.append(f"Top bar: {join_names(names_of(by_region['top']))}.")
        main = by_region["main"]
        if main:
            rows: list[list[UIElement]] = []
            for el in main:  # already in reading order
                if rows and box_center(el.box)[1] - box_center(rows[-1][0].box)[1] <= ROW_GAP:
                    rows[-1].append(el)
                else:
                    rows.append([el])
            firsts = [min(r, key=lambda e: (not clean_text(e.text), box_area(e.box))) for r in rows]
            if len(rows) >= 3 and names_of(firsts):
                parts.append(f"Main area: {len(rows)} rows, starting with {join_names(names_of(firsts))}.")
            elif names_of(main):
                parts.append(f"Main area: {join_names(names_of(main))}.")
        if names_of(by_region["bottom"]):
            parts.append(f"Bottom bar: {join_names(names_of(by_region['bottom']))}.")
        if not parts:
            return []
        answer = " ".join(parts)
        if len(answer) > MAX_ANSWER_CHARS:
            return []
        return [self.qa("page_structure", {}, answer, source="elements")]

    def element_region(self) -> list[QA]:
        out = []
        for name, el in self.names.items():
            region = REGION_NAMES[region_of(el.box)]
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
                    out.append(
                        self.qa(
                            "what_happens", {"ref": element_ref(el)}, effect, **self._el_meta(name, el, "transitions")
                        )
                    )
            return out
        coat = self.step.coat
        result = first_sentences(coat.action_result) if coat is not None else ""
        name = golden_target(self.step, self.elements, self.names) if result else None
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
    """At most ``per_step`` Q&A for one step, one of each kind per pass in an order drawn from the step's RNG."""
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
