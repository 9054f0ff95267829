"""The Q&A record of instruction evolution, its levels and kinds, and its JSONL form."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from ipl_jax import storage
from ipl_jax.data.records import DataError

LEVELS = (1, 2, 3)
# I: grounding ("Where is X?" -> a box), referring ("What is at <box>?" -> the element's text), page description;
# II: widget function ("What does X do?"), nesting (the element a label belongs to, from box containment);
# III: page structure (top bar / main area / bottom bar), element region ("In which part of the screen is X?"),
# what happens on a tap (from step.meta["transitions"] when present, else the golden click's CoaT action_result).
KINDS_BY_LEVEL = {
    1: ("grounding", "referring", "page_description"),
    2: ("widget_function", "nesting"),
    3: ("page_structure", "element_region", "what_happens"),
}
LEVEL_OF_KIND = {kind: level for level, kinds in KINDS_BY_LEVEL.items() for kind in kinds}

# Answer length limits, shared by generation (which stays inside them) and the filter.
MIN_ANSWER_CHARS = 2
MAX_ANSWER_CHARS = 300
MAX_ANSWER_WORDS = 60


@dataclasses.dataclass(frozen=True)
class QA:
    """One question/answer pair about the screen of step ``(episode_id, step_id)``: ``level`` 1-3, ``kind``
    (``KINDS_BY_LEVEL``), ``meta`` (``source``, element ``target`` and ``box``, template index).
    """

    episode_id: str
    step_id: int
    level: int
    kind: str
    question: str
    answer: str
    meta: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict:
        return {
            "episode_id": self.episode_id,
            "step_id": self.step_id,
            "level": self.level,
            "kind": self.kind,
            "question": self.question,
            "answer": self.answer,
            "meta": self.meta,
        }


# ---------------------------------------------------------------------------------------------- JSONL


def write_qas_jsonl(path: str | Path, qas: Iterable[QA]) -> int:
    """Write one JSON object per line; returns the number written."""
    n = 0
    with storage.as_path(path).open("w", encoding="utf-8") as f:
        for qa in qas:
            f.write(json.dumps(qa.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


_QA_FIELDS = {"episode_id": str, "step_id": int, "level": int, "kind": str, "question": str, "answer": str}


def read_qas_jsonl(path: str | Path) -> list[QA]:
    """Read a file written by ``write_qas_jsonl``. A malformed line raises DataError naming the line and field."""
    out = []
    with storage.as_path(path).open(encoding="utf-8") as f:
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
