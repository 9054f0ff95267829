"""The automatic Q&A filter (the counterpart of the paper's human filter): drops answers that justify a given
action, name several actions, are empty / too short / too long, duplicate another, or carry a malformed box."""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Iterable

from ipl_jax.coat.actions import BOX_END, BOX_START
from ipl_jax.data.evolution.qa import MAX_ANSWER_CHARS, MAX_ANSWER_WORDS, MIN_ANSWER_CHARS, QA
from ipl_jax.data.evolution.screen import clean_text

FILTER_REASONS = (
    "empty",
    "bad_box",
    "justifies_action",
    "multiple_actions",
    "too_short",
    "too_long",
    "duplicate",
    "near_duplicate",
)

# Phrases with which an annotator justifies the action it was handed instead of reading the screen.
_JUSTIFY_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bsince\b[^.]{0,80}\bnext action\b",
        r"\bmatch(?:es|ed|ing)?\s+(?:with\s+)?the\s+annotat",
        r"\b(?:the|this|given|provided)\s+annotation\b",
        r"\baccording to the annotat",
        r"\bannotated (?:next )?action\b",
        r"\bas the next action is\b",
        r"\b(?:provided|given|golden|ground[- ]truth|required)\s+(?:next\s+)?action\b",
        r"\bthe next action is\b[^.]{0,80}\b(?:therefore|so|thus)\b",
        r"\btherefore,?\s+the next action\b",
    )
]

_ACTION_VERB = (
    r"(?:click(?:s|ed|ing)?|tap(?:s|ped|ping)?|scroll(?:s|ed|ing)?|swip(?:e|es|ed|ing)|"
    r"long[- ]press(?:es|ed|ing)?|press(?:es|ed|ing)?|typ(?:e|es|ed|ing)|input(?:s|ting)?)"
)
# Two actions offered as alternatives inside one sentence: "tap Search or scroll down", "swiping up or scrolling
# down", "Alternatively, press back".
_MULTI_ACTION_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\b"
        + _ACTION_VERB
        + r"\b[^.!?]{0,80}?\b(?:or|and/or|alternatively|otherwise)\b[^.!?]{0,40}?\b"
        + _ACTION_VERB
        + r"\b",
        r"\balternatively\b[^.!?]{0,40}\b" + _ACTION_VERB + r"\b",
    )
]

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


def drop_reason(
    qa: QA,
    *,
    min_answer_chars: int = MIN_ANSWER_CHARS,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    max_answer_words: int = MAX_ANSWER_WORDS,
) -> str | None:
    """Why one Q&A should be dropped, judged on its own (duplicates need the others: see ``filter_qas``)."""
    q, a = clean_text(qa.question), clean_text(qa.answer)
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
    """Keep the Q&A that pass ``drop_reason`` and are not (near) duplicates on their screen; returns ``(kept,
    counts)`` with one count per FILTER_REASONS plus ``kept``.
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
