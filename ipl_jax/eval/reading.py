"""Whether a policy reads the screen, scored against what the data knows of it (the synthetic world's renderer):

- ``page``: the share of steps whose predicted description (CoaT turn 1) names the step's page
  (``meta["page_name"]``, e.g. "the chat with Anna"; ``page_named``). None for data whose steps lack it (AITZ, AMEX).
- ``texts``: the mean over steps of the share of the screen's element texts the description reproduces
  (``texts_read``; the texts of ``usable_elements``: not the status bar).
- ``grounding``: over steps whose golden action is a click / long press on an element (it has a box), the share
  whose predicted action has the same type and a point inside that box (``grounded``).

The per-step functions are pure; ``reading_scores`` pairs a split's steps with its evaluation records;
``chat_reading_scores`` asks a base model the questions of its pretraining chats about held-out screens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ipl_jax.coat.actions import Action, box_center, parse_grounding
from ipl_jax.coat.metrics import POINT_TYPES, finite_point, in_box
from ipl_jax.data.dialogue import chat_example
from ipl_jax.data.evolution.screen import usable_elements
from ipl_jax.data.records import Step
from ipl_jax.data.screenshots import decode_pixels
from ipl_jax.envs.synthetic.reading import fold_text, qa_messages, reading_qa
from ipl_jax.model.decode import greedy_generate
from ipl_jax.model.inputs import prepare_inputs
from ipl_jax.progress import progress

PAGE_KEY = "page_name"  # the step meta key holding the page phrase (written by the synthetic world)
SCORES = ("page", "texts", "grounding")
_ARTICLE = re.compile(r"^(?:the|a|an)\s+")


def page_named(description: str | None, page_name: str | None) -> bool | None:
    """Whether ``description`` names the page ``page_name``: both case-folded with whitespace collapsed, one leading
    article ("the", "a", "an") of the page phrase dropped (a description may say "This is the Settings list" or
    "Settings list"), then the phrase must occur in the description between word boundaries ("chat with anna" is
    not found in "chat with annabel"). None when there is no page phrase (a dataset that does not record it)."""
    phrase = _ARTICLE.sub("", fold_text(page_name))
    if not phrase:
        return None
    return re.search(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", fold_text(description)) is not None


def texts_read(description: str | None, texts: Sequence[str]) -> float | None:
    """The share of the distinct non-empty ``texts`` (case-folded, whitespace collapsed) that occur in
    ``description`` as substrings (case-insensitive). None when ``texts`` holds none."""
    wanted = {fold_text(t) for t in texts} - {""}
    if not wanted:
        return None
    desc = fold_text(description)
    return sum(t in desc for t in wanted) / len(wanted)


def grounded(pred: Action | None, gold: Action) -> bool | None:
    """Whether ``pred`` acts on the golden target element: None unless ``gold`` is a click / long press with a box
    (the element it acts on); else True when ``pred`` is parsed, of ``gold``'s type, and its point is finite and
    inside ``gold.box`` (edges included, no enlargement: stricter than Step.Acc's click rule, which also takes
    enlarged boxes and points within 0.14 of the golden one)."""
    if gold.type not in POINT_TYPES or gold.box is None:
        return None
    if pred is None or not pred.parsed or pred.type != gold.type or pred.point is None:
        return False
    point = finite_point(pred.point)
    return point is not None and in_box(point, gold.box)


def screen_texts(step: Step) -> list[str]:
    """The non-empty texts of the step's elements outside the status bar (``usable_elements``), reading order."""
    return [e.text for e in usable_elements(step) if (e.text or "").strip()]


def step_reading(step: Step, record: dict) -> dict:
    """{page, texts, grounding} of one step (each None where it does not apply) from its evaluation record
    (``evaluate_policy``'s: ``turns[0]`` the description, ``action`` the parsed prediction as JSON)."""
    description = (record.get("turns") or [""])[0]
    pred = Action.from_json(record["action"]) if record.get("action") else None
    return {
        "page": page_named(description, step.meta.get(PAGE_KEY)),
        "texts": texts_read(description, screen_texts(step)),
        "grounding": grounded(pred, step.action),
    }


def reading_scores(steps: Sequence[Step], records: Sequence[dict]) -> dict:
    """A split's reading scores: ``page``, ``texts``, ``grounding`` (means over the steps where each applies; None
    where none does) and the counts ``steps``, ``page_steps``, ``texts_steps``, ``grounding_steps``. ``records`` are
    matched to ``steps`` by (episode_id, step_id); a step without a record is an error."""
    by_key = {(str(r["episode_id"]), int(r["step_id"])): r for r in records}
    values: dict[str, list[float]] = {k: [] for k in SCORES}
    for step in steps:
        key = (str(step.episode_id), int(step.step_id))
        if key not in by_key:
            raise ValueError(f"reading_scores: no evaluation record for episode {key[0]!r} step {key[1]}")
        for name, v in step_reading(step, by_key[key]).items():
            if v is not None:
                values[name].append(float(v))
    out: dict = {k: (sum(v) / len(v) if v else None) for k, v in values.items()}
    out["steps"] = len(steps)
    out.update({f"{k}_steps": len(values[k]) for k in SCORES})
    return out


# ------------------------------------------------------------------------------ a base model's reading chats


CHAT_ANSWER_TOKENS = {"describe": 72, "texts": 96, "where": 24, "what": 16, "names": 16, "typed": 16}
CHAT_BATCH = 8


def box_hit(answer: str, golden) -> bool:
    """The centre of the box (or point) ``answer`` gives lies inside ``golden`` (screen fractions, edges in)."""
    box = parse_grounding(answer)
    return box is not None and in_box(box_center(box), golden)


def chat_answer_score(kind: str, answer: str, golden: str, step: Step) -> float | None:
    """One answer of a reading chat (``envs/synthetic/reading.py``) scored: ``describe`` names the page (``page``),
    ``texts`` the share of the screen's texts reproduced, ``where`` the box's centre in the element's, ``what``
    the element's text exactly, ``names`` and ``typed`` the task's answer exactly."""
    if kind == "describe":
        named = page_named(answer, step.meta.get(PAGE_KEY))
        return None if named is None else float(named)
    if kind == "texts":
        return texts_read(answer, screen_texts(step))
    if kind == "where":
        return float(box_hit(answer, parse_grounding(golden)))
    return float(fold_text(answer) == fold_text(golden))


def _chat_prompts(policy, step, seed: int, chat) -> list[tuple]:
    """[(kind, prefix ids, (pixels, grid), golden answer, step)]: each question of the screen's chat with the
    earlier golden answers given."""
    qa = reading_qa(step, seed, chat)
    messages, kinds, n = qa_messages(qa), [kind for kind, _, _ in qa], len(qa)
    pixels = decode_pixels(step, policy.image_config)
    ex = chat_example(policy.tokenizer, messages, (1,) * n, *pixels, policy.image_config.merge_size)
    starts = np.flatnonzero(np.diff(np.concatenate([[0], ex.loss_mask])) == 1)
    return [
        (kind, ex.input_ids[: starts[k]], pixels, messages[2 * k + 1]["content"], step) for k, kind in enumerate(kinds)
    ]


def _greedy_answers(policy, rows, max_new: int) -> list[str]:
    """Greedy answers of ``rows`` = [(prefix ids int32[T_i], (pixels f32[N_i, D], grid int[1, 3]))]."""
    cfg, tok = policy.cfg, policy.tokenizer
    ids = [np.asarray(r[0], np.int32) for r in rows]
    pv = np.concatenate([r[1][0] for r in rows])
    grid = np.concatenate([r[1][1] for r in rows])
    bucket = 64 * -(-max(len(i) for i in ids) // 64)
    inputs = prepare_inputs(
        cfg, ids, None, pv, grid, text_buckets=(bucket,), patch_buckets=(len(pv),), pad_id=tok.ids.pad
    )
    tokens, counts = greedy_generate(policy.params, cfg, inputs, max_new, eos_ids=tok.ids.eos, pad_id=tok.ids.pad)
    tokens, counts = np.asarray(tokens), np.asarray(counts)
    return [tok.decode(tokens[i, : counts[i]], skip_special_tokens=True) for i in range(len(rows))]


def chat_reading_scores(policy, steps: Sequence[Step], seed: int, chat) -> dict:
    """A base model's held-out reading: greedy answers to every question of each screen's reading chat (earlier
    answers teacher-forced); ``{describe, texts, where, what, names, typed}`` means (None where no screen asks),
    ``screens``, and the first three answers of each kind beside the golden ones."""
    rows: dict[str, list] = {k: [] for k in CHAT_ANSWER_TOKENS}
    for step in steps:
        for kind, *row in _chat_prompts(policy, step, seed, chat):
            rows[kind].append(row)
    scores, examples = {}, {}
    for kind, kind_rows in rows.items():
        answers = []
        for i in progress(range(0, len(kind_rows), CHAT_BATCH), desc=f"reading: {kind}"):
            chunk = kind_rows[i : i + CHAT_BATCH]
            answers += _greedy_answers(policy, [(r[0], r[1]) for r in chunk], CHAT_ANSWER_TOKENS[kind])
        values = [chat_answer_score(kind, a, r[2], r[3]) for a, r in zip(answers, kind_rows)]
        values = [v for v in values if v is not None]
        scores[kind] = round(float(np.mean(values)), 4) if values else None
        examples[kind] = [{"answer": a, "golden": r[2]} for a, r in zip(answers[:3], kind_rows[:3])]
    return {**scores, "screens": len(steps), "examples": examples}
