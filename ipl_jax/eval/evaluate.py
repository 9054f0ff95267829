"""Evaluation: ``ipl-jax score`` (a predictions file against a dataset) and ``ipl-jax eval`` (greedy CoaT decoding).

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

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

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
from ipl_jax.data.datasets import LOADERS, load_dataset  # noqa: F401  (re-exported: `score` reads datasets)
from ipl_jax.data.records import DataError, Episode, Step
from ipl_jax.coat.metrics import DEFAULT_RULES, FORMATS, RULES
from ipl_jax.coat.tables import format_table, score_episodes

if TYPE_CHECKING:
    from ipl_jax.data.image_processing import ImageProcessorConfig
    from ipl_jax.sampling import SamplerConfig

__all__ = ["score_main", "score_episodes", "load_predictions", "prediction_to_action", "load_dataset",
           "EvalConfig", "evaluate_policy", "eval_main"]

# ------------------------------------------------------------------------------------------ predictions


def split_prediction_text(text: str) -> tuple[str, Optional[str]]:
    """(action text, grounding text or None) of a raw prediction string; see the module docstring."""
    i = text.find(BOX_START)
    if i >= 0:
        return text[:i], text[i:]
    head, sep, rest = text.strip().partition("\n")
    return head, (rest if sep and rest.strip() else None)


def _fraction(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) and 0.0 <= v <= 1.0 else None


def _fractions(v: Any, n: int) -> Optional[tuple[float, ...]]:
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
        return Action(type=t, point=point, box=box, target=d.get("target") if isinstance(d.get("target"), str) else None)
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
                raise DataError(*where, "step_id", f"episode {key[0]!r} step {step} already given on line {seen_at[key]}")
            out[key] = prediction_to_action(rec["prediction"])
            seen_at[key] = n
    return out


# ------------------------------------------------------------------------------------------------ score


def _score_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ipl-jax score", description="Score a predictions JSONL file against a dataset.")
    p.add_argument("--data", required=True, help="dataset root directory")
    p.add_argument("--format", required=True, choices=FORMATS, dest="fmt", help="dataset format")
    p.add_argument("--predictions", required=True, help="predictions JSONL file (see ipl_jax/evaluate.py)")
    p.add_argument("--split", default="test",
                   help="dataset split (default: test; for AMEX 'all' reads every episode file)")
    p.add_argument("--rules", choices=tuple(RULES), default=None,
                   help="matching rule set (default: the format's own: " +
                        ", ".join(f"{k}->{v}" for k, v in DEFAULT_RULES.items()) + ")")
    p.add_argument("--json", default=None, help="also write the metric table as JSON to this file")
    return p


def score_main(argv: list[str]) -> int:
    """``ipl-jax score``: print the Step.Acc table of a predictions file; 0 on success, 1 on bad input."""
    args = _score_parser().parse_args(argv)
    try:
        predictions = load_predictions(args.predictions)
        episodes = load_dataset(args.data, args.fmt, args.split)
    except (DataError, FileNotFoundError, ValueError) as e:  # bad input: a clear message, no traceback
        print(f"ipl-jax score: {e}", file=sys.stderr)
        return 1
    if not episodes:
        print(f"ipl-jax score: no episodes in {args.data} (format {args.fmt}, split {args.split})", file=sys.stderr)
        return 1
    table = score_episodes(episodes, predictions, args.fmt, args.rules)
    step_keys = {(str(s.episode_id), int(s.step_id)) for ep in episodes for s in ep.steps}
    unmatched = sum(k not in step_keys for k in predictions)
    missing = sum(k not in predictions for k in step_keys)
    table["predictions_unmatched"] = unmatched
    table["steps_without_prediction"] = missing
    print(format_table(table))
    if unmatched or missing:
        print(f"\nnote: {missing} steps had no prediction (scored as misses); "
              f"{unmatched} predictions matched no step of the split (ignored)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return 0


# ------------------------------------------------------------------------------------------------- eval
# Model-driven evaluation (``eval_main(argv)``: greedy CoaT decoding over a dataset split, then
# ``score_episodes`` on the decoded actions) belongs below this line.


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

    sampler: "SamplerConfig"
    image_config: "ImageProcessorConfig"
    batch_size: int = 8
    fmt: str = "aitz"
    rules: Optional[str] = None
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


def evaluate_policy(params: dict, cfg, tokenizer, steps: Sequence[Any], config: EvalConfig,
                    mesh=None) -> tuple[list[dict], dict]:
    """Greedy CoaT decoding of every step, parsed with ``parse_action`` and scored with ``score_episodes``.

    steps: Steps (grouped into episodes by id, for episode success / goal progress) or Episodes.
    Returns (predictions, metrics): one record per step, in order — ``episode_id``, ``step_id``,
    ``prediction`` ({"action": s3, "grounding": s4}: readable by ``ipl-jax score``), ``turns`` (the four raw
    turn texts), ``finished`` (per turn: ended with ``<|im_end|>``), ``action`` (parsed), ``golden``,
    ``type_match``, ``exact_match`` — and the metric table of ``config.fmt``.
    """
    from ipl_jax.coat.metrics import match_step
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
    batch_size = min(int(config.batch_size), len(flat))
    for batch in iter_sampled_batches(params, cfg, tokenizer, config.image_config, flat, sconfig, config.seed,
                                      batch_size, mesh):
        texts = turn_texts(batch.tree, tokenizer)
        finished = [np.asarray(f).reshape(len(batch.steps), -1) for f in batch.tree.finished]
        for row in range(batch.num_valid):
            step = batch.steps[row]
            turns = [str(texts[t].reshape(len(batch.steps), -1)[row, 0]) for t in range(4)]
            action = parse_action(turns[2], turns[3])
            key = (str(step.episode_id), int(step.step_id))
            predictions[key] = action
            verdict = match_step(action, step, rule_set)
            records.append({
                "episode_id": key[0], "step_id": key[1],
                "prediction": {"action": turns[2], "grounding": turns[3]},
                "turns": turns, "finished": [bool(finished[t][row, 0]) for t in range(4)],
                "action": action.to_json(), "golden": step.action.to_json(),
                "type_match": bool(verdict.type_match), "exact_match": bool(verdict.exact_match),
            })
    return records, score_episodes(episodes, predictions, config.fmt, rule_set)


def _eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ipl-jax eval", description="Greedy CoaT decoding of a dataset split with a "
                                "checkpoint, scored with the benchmark's Step.Acc table.")
    p.add_argument("--checkpoint", required=True, help="Hugging Face Qwen2-VL directory (model + tokenizer)")
    p.add_argument("--data", required=True, help="dataset root directory")
    p.add_argument("--format", required=True, choices=FORMATS, dest="fmt", help="dataset format")
    p.add_argument("--split", default="test")
    p.add_argument("--rules", choices=tuple(RULES), default=None, help="matching rule set (default: the format's)")
    p.add_argument("--json", default=None, help="write the metric table as JSON here")
    p.add_argument("--predictions", default=None, help="write one JSON line per step here (raw turns, action, "
                   "golden, verdicts; re-scorable with ipl-jax score)")
    p.add_argument("--steps", type=int, default=None, help="evaluate only the first N steps")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-turn-tokens", type=int, nargs=4, default=(256, 128, 32, 32),
                   metavar=("T1", "T2", "T3", "T4"))
    p.add_argument("--mesh", action="store_true", help="shard over every device (batch over data x fsdp)")
    p.add_argument("--blank-screens", action="store_true", help="replace every screenshot by a grey image of "
                   "its size (the control that shows how much accuracy comes from reading the screen)")
    return p


def eval_main(argv: list[str]) -> int:
    """``ipl-jax eval``: print the Step.Acc table of greedy CoaT decoding; 0 on success, 1 on bad input."""
    args = _eval_parser().parse_args(argv)
    from ipl_jax.data.datasets import dataset_steps
    from ipl_jax.eval.policy import load_policy
    from ipl_jax.sampling import SamplerConfig

    try:
        params, cfg, tokenizer, image_config, mesh = load_policy(args.checkpoint, args.mesh)
        episodes, steps = dataset_steps(args.data, args.fmt, args.split, args.steps)
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"ipl-jax eval: {e}", file=sys.stderr)
        return 1
    if not steps:
        print(f"ipl-jax eval: no steps in {args.data} (format {args.fmt}, split {args.split})", file=sys.stderr)
        return 1
    if args.steps is not None:  # score only the episodes' steps that were decoded
        kept = {(str(s.episode_id), int(s.step_id)) for s in steps}
        episodes = [dataclasses.replace(ep, steps=tuple(s for s in ep.steps
                                                       if (str(s.episode_id), int(s.step_id)) in kept))
                    for ep in episodes]
        episodes = [ep for ep in episodes if ep.steps]
    config = EvalConfig(sampler=SamplerConfig.for_tokenizer(tokenizer, max_turn_tokens=tuple(args.max_turn_tokens)),
                        image_config=image_config, batch_size=args.batch_size, fmt=args.fmt, rules=args.rules,
                        blank_screens=args.blank_screens)
    records, table = evaluate_policy(params, cfg, tokenizer, episodes, config, mesh)
    print(format_table(table))
    for path, text in ((args.json, json.dumps(table, indent=2) + "\n"),
                       (args.predictions, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text, encoding="utf-8")
    return 0
