"""Evaluation: scoring a predictions file against a dataset (``ipl-jax score``) and greedy CoaT decoding
(``ipl-jax eval``); the command lines are in ``ipl_jax/cli/``.

Predictions file (JSONL, one object per line)::

    {"episode_id": "5236...", "step_id": 0, "prediction": P}

``episode_id`` is a string (an integer is accepted and read as its decimal string), ``step_id`` an int. ``P``
is one of:

* a **string**: the model's raw action(+grounding) text in our CoaT form. If it holds ``<|box_start|>``, the
  action text is everything before the first ``<|box_start|>`` and the grounding is the rest; otherwise the
  first line is the action text and the remaining lines (if any) the grounding. E.g.
  ``"click Wi-Fi\\n<|box_start|>(120,340),(880,400)<|box_end|>"`` or ``"type \\"hello\\""``;
* ``{"action": s3, "grounding": s4}`` (``grounding`` optional): the two turn texts apart;
* a **structured action** ``{"type": t, ...}``: ``click`` / ``long_press`` with ``"x"``, ``"y"`` (screen
  fractions in [0, 1]) or ``"point": [x, y]`` or ``"box": [x1, y1, x2, y2]``; ``type`` / ``open_app`` with
  ``"text"``; ``scroll`` with ``"direction"`` (the finger's); ``press`` with ``"button"``; ``stop``; ``wait``.
  (``Action.to_json`` output is accepted as is.)

A prediction that does not parse, or a structured action with a missing or out-of-range field, scores as a miss
(it is never an error); a step with no line is a miss. A line that is not valid JSON, lacks ``episode_id`` /
``step_id`` / ``prediction``, or repeats an (episode_id, step_id) pair raises ``DataError`` naming the file and
line number.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ipl_jax.coat.actions import (
    ACTION_TYPES,
    BOX_START,
    BUTTONS,
    DIRECTIONS,
    Action,
    box_center,
    invalid_action,
    parse_action,
)
from ipl_jax.coat.metrics import DEFAULT_RULES
from ipl_jax.coat.tables import score_episodes
from ipl_jax.data.datasets import LOADERS, load_dataset  # noqa: F401  (re-exported: `score` reads datasets)
from ipl_jax.data.records import DataError, Episode, Step

if TYPE_CHECKING:
    from ipl_jax.data.image_processing import ImageProcessorConfig
    from ipl_jax.sampling import SamplerConfig

__all__ = [
    "score_episodes",
    "load_predictions",
    "prediction_to_action",
    "load_dataset",
    "EvalConfig",
    "evaluate_policy",
]

# ------------------------------------------------------------------------------------------ predictions


def split_prediction_text(text: str) -> tuple[str, str | None]:
    """(action text, grounding text or None) of a raw prediction string; see the module docstring."""
    i = text.find(BOX_START)
    if i >= 0:
        return text[:i], text[i:]
    head, sep, rest = text.strip().partition("\n")
    return head, (rest if sep and rest.strip() else None)


def _fraction(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) and 0.0 <= v <= 1.0 else None


def _fractions(v: Any, n: int) -> tuple[float, ...] | None:
    if not isinstance(v, (list, tuple)) or len(v) != n:
        return None
    out = tuple(_fraction(x) for x in v)
    return None if any(x is None for x in out) else out


def structured_action(d: dict) -> Action:
    """A structured prediction (``{"type": ...}``) as an Action; anything unusable gives an invalid action."""
    if d.get("parsed") is False:
        return invalid_action()
    t = d.get("type")
    t = t.lower() if isinstance(t, str) else None
    if t not in ACTION_TYPES:
        return invalid_action()
    if t in ("click", "long_press"):
        box = _fractions(d["box"], 4) if d.get("box") is not None else None
        if "x" in d or "y" in d:
            point = _fractions([d.get("x"), d.get("y")], 2)
        elif d.get("point") is not None:
            point = _fractions(d["point"], 2)
        elif box is not None:
            point = box_center(box)
        else:
            point = None
        if point is None:
            return invalid_action()
        return Action(
            type=t, point=point, box=box, target=d.get("target") if isinstance(d.get("target"), str) else None
        )
    if t in ("type", "open_app"):
        text = d.get("text")
        return Action(type=t, text=text) if isinstance(text, str) else invalid_action()
    if t == "scroll":
        direction = d.get("direction")
        direction = direction.lower() if isinstance(direction, str) else None
        return Action(type=t, direction=direction) if direction in DIRECTIONS else invalid_action()
    if t == "press":
        button = d.get("button")
        button = button.lower() if isinstance(button, str) else None
        return Action(type=t, button=button) if button in BUTTONS else invalid_action()
    status = d.get("status") if isinstance(d.get("status"), str) else None
    return Action(type=t, status=status if t == "stop" else None)


def prediction_to_action(p: Any) -> Action:
    """One ``prediction`` value (string, text dict or structured dict) as an Action. Never raises."""
    if isinstance(p, str):
        action_text, grounding = split_prediction_text(p)
        return parse_action(action_text, grounding)
    if isinstance(p, dict):
        if "action" in p:
            a, g = p.get("action"), p.get("grounding")
            if not isinstance(a, str):
                return invalid_action()
            return parse_action(a, g if isinstance(g, str) else None)
        if "type" in p:
            return structured_action(p)
    return invalid_action()


def load_predictions(path: str | Path) -> dict[tuple[str, int], Action]:
    """Read a predictions JSONL file into ``{(episode_id, step_id): Action}``; blank lines are skipped."""
    path = Path(path)
    out: dict[tuple[str, int], Action] = {}
    seen_at: dict[tuple[str, int], int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = (path, f"line {n}")
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(*where, "<json>", f"not valid JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(rec, dict):
                raise DataError(*where, "<json>", f"expected a JSON object, got {type(rec).__name__}")
            for field in ("episode_id", "step_id", "prediction"):
                if field not in rec:
                    raise DataError(*where, field, "missing")
            ep, step = rec["episode_id"], rec["step_id"]
            if isinstance(ep, bool) or not isinstance(ep, (str, int)):
                raise DataError(*where, "episode_id", f"expected a string, got {ep!r}")
            if isinstance(step, bool) or not isinstance(step, int):
                raise DataError(*where, "step_id", f"expected an int, got {step!r}")
            key = (str(ep), step)
            if key in out:
                raise DataError(
                    *where, "step_id", f"episode {key[0]!r} step {step} already given on line {seen_at[key]}"
                )
            out[key] = prediction_to_action(rec["prediction"])
            seen_at[key] = n
    return out


# ------------------------------------------------------------------------------------------------- eval
# Model-driven evaluation: greedy CoaT decoding over a dataset split, then ``score_episodes`` on the decoded
# actions (``ipl-jax eval``'s command line is ``ipl_jax/cli/eval.py``).


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Greedy CoaT evaluation settings.

    sampler: the tree sampler's settings; ``evaluate_policy`` makes them greedy (branching (1, 1, 1, 1),
    temperature 0: ``sampling.greedy_config``), keeping budgets, buckets and ids. image_config: how screenshots
    are preprocessed (the checkpoint's ``preprocessor_config.json``). batch_size: steps per jitted call (the last
    batch is padded). fmt / rules: the metric table and its rule set (None: the format's own). blank_screens:
    replace every screenshot by a uniform grey image of the same size -- the control that tells how much of the
    policy's accuracy comes from reading the screen rather than from the instruction and the action history.
    """

    sampler: SamplerConfig
    image_config: ImageProcessorConfig
    batch_size: int = 8
    fmt: str = "aitz"
    rules: str | None = None
    seed: int = 0
    blank_screens: bool = False


BLANK_GREY = (128, 128, 128)


def blank_screen(step: Step) -> Step:
    """``step`` with its screenshot replaced by a uniform grey image of the same size (loaded lazily)."""

    def image():
        from PIL import Image

        return Image.new("RGB", step.load_image().size, BLANK_GREY)

    return dataclasses.replace(step, image=image)


def _as_episodes(steps_or_episodes: Sequence[Any]) -> list[Episode]:
    """Episodes as given, or steps grouped into episodes by ``episode_id`` (first-appearance order)."""
    items = list(steps_or_episodes)
    if all(isinstance(x, Episode) for x in items):
        return items
    groups: dict[str, list] = {}
    for s in items:
        if not isinstance(s, Step):
            raise TypeError(f"evaluate_policy: expected Steps or Episodes, got {type(s).__name__}")
        groups.setdefault(str(s.episode_id), []).append(s)
    return [Episode(episode_id=k, instruction=v[0].instruction, steps=tuple(v)) for k, v in groups.items()]


def evaluate_policy(
    params: dict, cfg, tokenizer, steps: Sequence[Any], config: EvalConfig, mesh=None
) -> tuple[list[dict], dict]:
    """Greedy CoaT decoding of every step, parsed with ``parse_action`` and scored with ``score_episodes``.

    steps: Steps (grouped into episodes by id, for episode success / goal progress) or Episodes.
    Returns (predictions, metrics): one record per step, in order — ``episode_id``, ``step_id``,
    ``prediction`` ({"action": s3, "grounding": s4}: readable by ``ipl-jax score``), ``turns`` (the four raw
    turn texts), ``finished`` (per turn: ended with ``<|im_end|>``), ``action`` (parsed), ``golden``,
    ``type_match``, ``exact_match`` — and the metric table of ``config.fmt``.
    """
    from ipl_jax.coat.metrics import match_step
    from ipl_jax.progress import progress
    from ipl_jax.sampling import greedy_config, iter_sampled_batches
    from ipl_jax.sampling.tree_records import turn_texts

    episodes = _as_episodes(steps)
    flat = [s for ep in episodes for s in ep.steps]
    if config.blank_screens:
        flat = [blank_screen(s) for s in flat]
    rule_set = DEFAULT_RULES[config.fmt] if config.rules is None else config.rules
    sconfig = greedy_config(config.sampler)
    records: list[dict] = []
    predictions: dict[tuple[str, int], Action] = {}
    if not flat:
        return records, score_episodes(episodes, predictions, config.fmt, rule_set)
    # always the configured size (the last batch padded): a split shorter than a batch would otherwise compile the
    # sampler's programs again for its own size
    batch_size = int(config.batch_size)
    batches = iter_sampled_batches(
        params, cfg, tokenizer, config.image_config, flat, sconfig, config.seed, batch_size, mesh
    )
    for batch in progress(batches, total=-(-len(flat) // batch_size), desc="evaluation", unit="batch"):
        texts = turn_texts(batch.tree, tokenizer)
        finished = [np.asarray(f).reshape(len(batch.steps), -1) for f in batch.tree.finished]
        for row in range(batch.num_valid):
            step = batch.steps[row]
            turns = [str(texts[t].reshape(len(batch.steps), -1)[row, 0]) for t in range(4)]
            action = parse_action(turns[2], turns[3])
            key = (str(step.episode_id), int(step.step_id))
            predictions[key] = action
            verdict = match_step(action, step, rule_set)
            records.append(
                {
                    "episode_id": key[0],
                    "step_id": key[1],
                    "prediction": {"action": turns[2], "grounding": turns[3]},
                    "turns": turns,
                    "finished": [bool(finished[t][row, 0]) for t in range(4)],
                    "action": action.to_json(),
                    "golden": step.action.to_json(),
                    "type_match": bool(verdict.type_match),
                    "exact_match": bool(verdict.exact_match),
                }
            )
    return records, score_episodes(episodes, predictions, config.fmt, rule_set)
