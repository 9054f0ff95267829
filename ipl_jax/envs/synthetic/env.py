"""The synthetic world behind the environment protocol (``envs.protocol``): ``SyntheticEnv`` plays one ``World`` at a
time, and the live tasks are its ``EnvTask`` s (``split_world_tasks``: a split's first episodes, as the dataset
writer generates them; step limit ``min(max_steps, ceil(step_factor · expert steps))``).

Each observation carries the scripted expert's next action (the online learners' dense step reward needs it);
``score`` is 1.0 for a STOP at the goal (``tasks.is_done``), else 0.0.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ipl_jax.coat.actions import Action
from ipl_jax.envs.protocol import EnvError, EnvTask, Observation
from ipl_jax.envs.synthetic.config import WorldConfig
from ipl_jax.envs.synthetic.dataset import MAX_STEPS, episode_seed, split_config
from ipl_jax.envs.synthetic.expert import expert_decision
from ipl_jax.envs.synthetic.tasks import Task, is_done, sample_task
from ipl_jax.envs.synthetic.world import World


@dataclasses.dataclass(frozen=True)
class WorldSpec:
    """A synthetic ``EnvTask``'s ``spec``: the world's seed and config and the task played in it."""

    world_seed: int
    task: Task
    config: WorldConfig


class SyntheticEnv:
    """One synthetic world slot: in process, deterministic, so its slots are played in order (``concurrent``
    False)."""

    name = "synthetic"
    concurrent = False

    def __init__(self):
        self._world: World | None = None
        self._task: Task | None = None
        self._steps = 0
        self._stopped = False

    def reset(self, task: EnvTask) -> Observation:
        spec = task.spec
        if not isinstance(spec, WorldSpec):
            raise EnvError(f"synthetic task {task.name!r}: spec is {type(spec).__name__}, not a WorldSpec")
        self._world = World(spec.world_seed, spec.config)
        self._world.reset(spec.task)
        self._task, self._steps, self._stopped = spec.task, 0, False
        return self.observe()

    def _playing(self) -> World:
        if self._world is None:
            raise EnvError("synthetic: no episode (reset a task first)")
        return self._world

    def observe(self) -> Observation:
        world = self._playing()
        screen = world.screen
        return Observation(
            goal=self._task.instruction,
            image=screen.image,
            screen_size=screen.picture_size,
            step=self._steps,
            expert=expert_decision(world, self._task).action,
            elements=screen.elements,
            meta={"app": screen.app, "page": screen.page},
        )

    def act(self, action: Action) -> bool:
        _, done = self._playing().step(action)
        self._steps += 1
        self._stopped = bool(done)
        return self._stopped

    def score(self) -> float:
        return 1.0 if self._stopped and is_done(self._playing(), self._task) else 0.0

    def close(self) -> None:
        self._world = None


# ------------------------------------------------------------------------------------------------ live tasks


def expert_steps(world_seed: int, task: Task, config: WorldConfig, cap: int = MAX_STEPS) -> int:
    """How many actions the scripted expert needs for ``task`` in ``World(world_seed, config)`` (stop included)."""
    world = World(world_seed, config)
    world.reset(task)
    for t in range(cap):
        _, done = world.step(expert_decision(world, task).action)
        if done:
            return t + 1
    return cap


def world_task(
    world_seed: int, task: Task, config: WorldConfig, name: str, max_steps: int = MAX_STEPS, step_factor: float = 2.0
) -> EnvTask:
    """The ``EnvTask`` of ``task`` in ``World(world_seed, config)``; step limit ``min(max_steps, ceil(step_factor ·
    expert steps))``, at least 1."""
    limit = min(int(max_steps), int(math.ceil(step_factor * expert_steps(world_seed, task, config, max_steps))))
    return EnvTask(
        name=name,
        step_limit=max(1, limit),
        family=task.family,
        spec=WorldSpec(world_seed=int(world_seed), task=task, config=config),
    )


def split_world_tasks(
    split: str,
    n: int,
    seed: int = 0,
    config: WorldConfig | None = None,
    max_steps: int = MAX_STEPS,
    step_factor: float = 2.0,
) -> list[EnvTask]:
    """The first ``n`` episodes of a synthetic split as live tasks (as ``generate_split``'s episodes), named
    ``split/seed/i``."""
    cfg = split_config(split, config)
    out = []
    for i in range(int(n)):
        ws = episode_seed(seed, split, i)
        task = sample_task(np.random.default_rng([ws, 2]), cfg, unseen=(split == "test_task_unseen"))
        out.append(world_task(ws, task, cfg, f"{split}/{int(seed)}/{i}", max_steps, step_factor))
    return out
