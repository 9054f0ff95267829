"""Instruction evolution (docs/method.md §10): question/answer pairs about a screen, built from its UI annotations.

Three levels of kinds (``qa.KINDS_BY_LEVEL``); answers derive from the annotations alone and templates are a
pure function of ``(seed, episode_id, step_id)``. ``filter_qas`` stands in for the paper's human filter.
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
