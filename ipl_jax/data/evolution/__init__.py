"""Instruction evolution (docs/method.md §10): question/answer pairs about a screen, built from its UI annotations.

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

Modules: ``qa`` (the record, levels, JSONL), ``screen`` (facts read off the annotations), ``generate`` (templates,
the per-kind generators, the per-step selection), ``filters`` (``filter_qas``).
"""

from ipl_jax.data.evolution.filters import FILTER_REASONS, boxes_valid, drop_reason, filter_qas, normalise_text
from ipl_jax.data.evolution.generate import QUESTION_TEMPLATES, candidate_qas, evolve_step, evolve_steps
from ipl_jax.data.evolution.qa import (
    KINDS_BY_LEVEL,
    LEVEL_OF_KIND,
    LEVELS,
    MAX_ANSWER_CHARS,
    MAX_ANSWER_WORDS,
    MIN_ANSWER_CHARS,
    QA,
    read_qas_jsonl,
    write_qas_jsonl,
)
from ipl_jax.data.evolution.screen import element_name, element_ref, kind_noun, referents, usable_elements

__all__ = [
    "FILTER_REASONS",
    "boxes_valid",
    "drop_reason",
    "filter_qas",
    "normalise_text",
    "QUESTION_TEMPLATES",
    "candidate_qas",
    "evolve_step",
    "evolve_steps",
    "KINDS_BY_LEVEL",
    "LEVEL_OF_KIND",
    "LEVELS",
    "MAX_ANSWER_CHARS",
    "MAX_ANSWER_WORDS",
    "MIN_ANSWER_CHARS",
    "QA",
    "read_qas_jsonl",
    "write_qas_jsonl",
    "element_name",
    "element_ref",
    "kind_noun",
    "referents",
    "usable_elements",
]
