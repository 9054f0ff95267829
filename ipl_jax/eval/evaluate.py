"""Greedy CoaT evaluation of a policy (``ipl-jax eval``, the job's test and dev evaluation), scored with the
benchmark's Step.Acc table; per-step records are what ``ipl-jax score`` reads back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ipl_jax.coat.actions import Action, parse_action
from ipl_jax.coat.metrics import DEFAULT_RULES, match_step
from ipl_jax.coat.tables import score_episodes
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Episode, Step
from ipl_jax.progress import progress
from ipl_jax.sampling.batches import iter_sampled_batches
from ipl_jax.sampling.config import SamplerConfig, greedy_config
from ipl_jax.sampling.tree_records import turn_texts


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Greedy evaluation settings: sampler (made greedy), image_config, batch_size, fmt / rules (None: the format's),
    blank_screens (grey screenshots, a control).
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
    """Greedy CoaT decoding of every step, parsed and scored; returns (one record per step in order, the metric
    table of ``config.fmt``). steps: Steps (grouped by episode id) or Episodes.
    """
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
