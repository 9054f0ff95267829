"""Episodes from the world + expert + CoaT annotator, and the splits: ``train`` / ``dev`` / ``test`` (disjoint
seeds), ``test_app_unseen`` (held-out themes and layout) and ``test_task_unseen`` (held-out tasks).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ipl_jax.coat.actions import format_action
from ipl_jax.data.records import CoaT, Episode, Step
from ipl_jax.envs.synthetic import coat as coat_text
from ipl_jax.envs.synthetic.config import HELD_OUT_THEMES, HELD_OUT_VARIANTS, SEEN_VARIANTS, SPLITS, WorldConfig
from ipl_jax.envs.synthetic.expert import expert_decision
from ipl_jax.envs.synthetic.tasks import Task, is_done, sample_task
from ipl_jax.envs.synthetic.world import World

SPLIT_CODES = {"train": 1, "dev": 2, "test": 3, "test_app_unseen": 4, "test_task_unseen": 5}
# The default dataset (the `ipl-jax run` job's data); sizes chosen so that warm-up SFT of a tiny model on two
# CPU cores sees every template and family several times in a few minutes.
DEFAULT_SIZES = {"train": 1000, "dev": 100, "test": 200, "test_app_unseen": 100, "test_task_unseen": 100}
MAX_STEPS = 25


def split_config(name: str, config: WorldConfig | None = None) -> WorldConfig:
    """The world config a split is generated with."""
    config = config or WorldConfig()
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
    if name == "test_app_unseen":
        return dataclasses.replace(
            config, themes=HELD_OUT_THEMES, variants=tuple(SEEN_VARIANTS) + tuple(HELD_OUT_VARIANTS)
        )
    return config


def config_to_json(config: WorldConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def config_from_json(d: dict) -> WorldConfig:
    return WorldConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def episode_seed(seed: int, split: str, index: int) -> int:
    """The world seed of episode ``index`` of a split (distinct splits draw from distinct streams)."""
    return int(np.random.SeedSequence([int(seed), SPLIT_CODES[split], int(index)]).generate_state(1)[0])


def episode_id(split: str, seed: int, index: int) -> str:
    """The id of episode ``index`` of a split, all digits: the split's code, the seed (>= 4 digits), the index (6)."""
    return f"{SPLIT_CODES[split]}{int(seed):04d}{index:06d}"


def generate_episode(world_seed: int, task: Task, config: WorldConfig, episode_id: str, split: str = "") -> Episode:
    """Run the expert on ``task`` in ``World(world_seed, config)`` and annotate every step."""
    world = World(world_seed, config)
    screen = world.reset(task)
    text_rng = np.random.default_rng([world_seed, 1])  # paraphrase choices, apart from the world's stream
    steps, history, prev = [], [], None
    for t in range(MAX_STEPS):
        d = expert_decision(world, task)
        coat = CoaT(
            screen_desc=coat_text.describe_screen(screen, text_rng),
            action_think=coat_text.think(task, prev, screen, d, text_rng),
            action_desc=format_action(d.action),
            action_result=coat_text.action_result(d, text_rng),
        )
        meta = {
            "app": screen.app,
            "page": screen.page,
            "page_name": coat_text.page_name(screen),  # the page phrase descriptions use (eval/reading.py)
            "subset": task.subset,
            "transitions": screen.transitions(),
            "intent": d.intent,
            "family": task.family,
        }
        steps.append(
            Step(
                episode_id=episode_id,
                step_id=t,
                instruction=task.instruction,
                image=screen.painter(),
                screen_size=screen.picture_size,
                action=d.action,
                history=tuple(history),
                elements=screen.elements,
                coat=coat,
                meta=meta,
            )
        )
        history.append(coat.action_desc)
        screen, done = world.step(d.action)
        prev = d
        if done:
            break
    else:
        raise RuntimeError(f"expert did not finish {task.family} task {task.instruction!r} (world seed {world_seed})")
    if not is_done(world, task):
        raise RuntimeError(f"expert stopped before the goal of {task.instruction!r} (world seed {world_seed})")
    meta = {
        "world_seed": world_seed,
        "task": task.to_json(),
        "split": split,
        "subset": task.subset,
        "theme": world.theme,
        "variant": world.variant,
        "config": config_to_json(config),
    }
    return Episode(episode_id=episode_id, instruction=task.instruction, steps=tuple(steps), meta=meta)


def generate_split(name: str, n_episodes: int, seed: int = 0, config: WorldConfig | None = None) -> list[Episode]:
    """``n_episodes`` episodes of split ``name``. Same arguments => identical episodes (and images)."""
    cfg = split_config(name, config)
    if n_episodes < 0:
        raise ValueError(f"n_episodes must be >= 0, got {n_episodes}")
    out = []
    for i in range(n_episodes):
        ws = episode_seed(seed, name, i)
        task = sample_task(np.random.default_rng([ws, 2]), cfg, unseen=(name == "test_task_unseen"))
        out.append(generate_episode(ws, task, cfg, episode_id=episode_id(name, seed, i), split=name))
    return out


def replay(episode: Episode, actions=None):
    """Re-run an episode's actions (default: its golden ones) in a fresh world; returns (world, done, goal_reached)."""
    meta = episode.meta
    world = World(meta["world_seed"], config_from_json(meta["config"]))
    task = Task.from_json(meta["task"])
    world.reset(task)
    done = False
    for a in actions if actions is not None else [s.action for s in episode.steps]:
        _, done = world.step(a)
        if done:
            break
    return world, done, is_done(world, task)
