"""Whole episodes of a policy in a batch of live synthetic worlds (online PPO and ``eval.online``): one jitted
sampler call per step, keys from ``step_uid(name, t)``, step limit ``min(max_steps, ceil(step_factor · expert
steps))``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.actions import Action, format_action
from ipl_jax.coat.rewards import RewardConfig, encode_actions, encode_golden, leaf_rewards
from ipl_jax.data.dialogue import DEFAULT_PROMPTS, CoaTPrompts
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.envs.synthetic.config import WorldConfig
from ipl_jax.envs.synthetic.dataset import MAX_STEPS, episode_seed, split_config
from ipl_jax.envs.synthetic.expert import expert_decision
from ipl_jax.envs.synthetic.tasks import Task, is_done, sample_task
from ipl_jax.envs.synthetic.world import World
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl import common
from ipl_jax.rl import rewards as rewards_lib
from ipl_jax.rl.advantages import screen_thumbnail
from ipl_jax.rl.sampling import Completion, tree_completions
from ipl_jax.rl.sections import PPOSettings
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.prompts import StepPrompts, pack_tree_prompts, step_prompts
from ipl_jax.sampling.tree_sampler import sample_tree


@dataclasses.dataclass(frozen=True)
class WorldTask:
    """One episode to play: a world seed, its config, the task, the step limit and a name (the key id)."""

    world_seed: int
    task: Task
    config: WorldConfig
    step_limit: int
    name: str


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
) -> WorldTask:
    """A ``WorldTask`` whose step limit is ``min(max_steps, ceil(step_factor · expert steps))``."""
    limit = min(int(max_steps), int(math.ceil(step_factor * expert_steps(world_seed, task, config, max_steps))))
    return WorldTask(world_seed=int(world_seed), task=task, config=config, step_limit=max(1, limit), name=name)


def split_world_tasks(
    split: str,
    n: int,
    seed: int = 0,
    config: WorldConfig | None = None,
    max_steps: int = MAX_STEPS,
    step_factor: float = 2.0,
) -> list[WorldTask]:
    """The first ``n`` episodes of a synthetic split as live tasks (as ``generate_split``'s episodes)."""
    cfg = split_config(split, config)
    out = []
    for i in range(int(n)):
        ws = episode_seed(seed, split, i)
        task = sample_task(np.random.default_rng([ws, 2]), cfg, unseen=(split == "test_task_unseen"))
        out.append(world_task(ws, task, cfg, f"{split}/{int(seed)}/{i}", max_steps, step_factor))
    return out


def replicate(tasks: Sequence[WorldTask], k: int) -> list[WorldTask]:
    """Each task k times (concurrent trajectories of one task: same world, distinct names, hence keys)."""
    return [dataclasses.replace(t, name=f"{t.name}#{j}") for t in tasks for j in range(int(k))]


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are played: sampler (branching forced to (1, 1, 1, 1)), image_config, batch_size (worlds per
    call), settings (the ``rl.ppo`` section: its step_reward and success_reward), thumb_size, keep_prompts."""

    sampler: SamplerConfig
    image_config: ImageProcessorConfig
    batch_size: int = 8
    prompts: CoaTPrompts = DEFAULT_PROMPTS
    reward: RewardConfig = RewardConfig()
    settings: PPOSettings = PPOSettings()
    thumb_size: tuple[int, int] = (16, 32)
    keep_prompts: bool = True

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"RolloutConfig.batch_size must be >= 1, got {self.batch_size}")
        object.__setattr__(self, "sampler", self.sampler.replace(branching=(1, 1, 1, 1)))


@dataclasses.dataclass
class StepRecord:
    """One environment step: prompt (if kept), completion, turn texts, parsed and expert actions, reward, thumbnail."""

    t: int
    prompt: StepPrompts | None
    completion: Completion
    texts: list
    action: Action
    golden: Action
    reward: float
    thumb: np.ndarray
    app: str
    page: str


@dataclasses.dataclass
class Trajectory:
    """One episode: task, steps, and outcome flags ``stopped``, ``success`` (stopped at the goal), ``truncated`` (step
    limit), ``cut`` (budget ran out, outcome unknown)."""

    task: WorldTask
    steps: list = dataclasses.field(default_factory=list)
    stopped: bool = False
    success: bool = False
    truncated: bool = False
    terminal_reward: float = 0.0
    cut: bool = False

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def step_rewards(self) -> np.ndarray:
        return np.asarray([s.reward for s in self.steps], np.float32)


def _step_of(world, wt: WorldTask, t: int, history: Sequence[str]) -> Step:
    screen = world.screen
    return Step(
        episode_id=wt.name,
        step_id=t,
        instruction=wt.task.instruction,
        image=screen.painter(),
        screen_size=screen.picture_size,
        action=expert_decision(world, wt.task).action,
        history=tuple(history),
        elements=screen.elements,
        meta={"app": screen.app, "page": screen.page},
    )


def _step_rewards(actions, fmt, steps, config: RolloutConfig, n: int) -> np.ndarray:
    """Rewards f32[n] of ``actions`` against the experts' ``steps`` (padded to n rows: one shape, one compile)."""
    pad = n - len(actions)
    pred = encode_actions(list(actions) + [None] * pad)
    golden_steps = list(steps) + [steps[0]] * pad
    if config.settings.step_reward == "leaf":
        r = leaf_rewards(pred, encode_golden(golden_steps), config.reward).value
    else:
        ok = np.asarray(list(fmt) + [False] * pad)
        r = rewards_lib.uir1_rewards(pred, ok, rewards_lib.encode_uir1_golden(golden_steps)).total / 3.0
    return np.asarray(r, np.float32)[: len(actions)]


def act(
    params: dict,
    cfg: Qwen2VLConfig,
    items: Sequence[StepPrompts],
    steps: Sequence[Step],
    seed,
    config: RolloutConfig,
    mesh=None,
) -> list[Completion]:
    """One completion per prompt (branching (1, 1, 1, 1), padded to ``config.batch_size``); ``steps`` is unread
    (a scripted stand-in may use it)."""
    del steps
    packed = pack_tree_prompts(cfg, list(items), config.sampler, seed, batch_size=config.batch_size)
    tree = distributed.to_host(sample_tree(params, cfg, packed, config.sampler, mesh))
    return [g[0] for g in tree_completions(tree, config.batch_size, 1)[: len(items)]]


def rollout(
    params: dict,
    cfg: Qwen2VLConfig,
    tokenizer,
    world_tasks: Sequence[WorldTask],
    rng,
    config: RolloutConfig,
    mesh=None,
    max_env_steps: int | None = None,
) -> list[Trajectory]:
    """Play every task to its end, ``config.batch_size`` worlds at a time; one ``Trajectory`` per task.
    ``max_env_steps`` cuts episodes still running; an unparsable completion is a no-op with reward 0.
    """
    seed = common.key_seed(rng)
    out = []
    for start in range(0, len(world_tasks), config.batch_size):
        left = None if max_env_steps is None else max_env_steps - sum(tr.num_steps for tr in out)
        batch = list(world_tasks[start : start + config.batch_size])
        out.extend(_rollout_batch(params, cfg, tokenizer, batch, seed, config, mesh, left))
    return out


def _rollout_batch(params, cfg, tokenizer, tasks: list[WorldTask], seed, config: RolloutConfig, mesh, budget=None):
    worlds, trajs, histories = [], [], []
    for wt in tasks:
        world = World(wt.world_seed, wt.config)
        world.reset(wt.task)
        worlds.append(world)
        trajs.append(Trajectory(task=wt))
        histories.append([])
    active = list(range(len(tasks)))
    t = 0
    while active:
        if budget is not None:  # the first worlds still running take what is left; the rest are cut unfinished
            left = max(0, budget - sum(tr.num_steps for tr in trajs))
            for i in active[left:]:
                trajs[i].cut = True
            active = active[:left]
            if not active:
                break
        steps = [_step_of(worlds[i], tasks[i], t, histories[i]) for i in active]
        images = [worlds[i].screen.image for i in active]
        items = [
            step_prompts(s, tokenizer, config.image_config, cfg, config.prompts, image=img)
            for s, img in zip(steps, images)
        ]
        comps = act(params, cfg, items, steps, seed, config, mesh)
        parsed = [common.parse_completion(tokenizer, c, "coat") for c in comps]
        actions = [a for a, _, _ in parsed]
        r = _step_rewards(actions, [ok for _, ok, _ in parsed], steps, config, config.batch_size)
        still = []
        for k, i in enumerate(active):
            world, traj, action = worlds[i], trajs[i], actions[k]
            screen = world.screen
            reward = float(r[k]) if action.parsed else 0.0
            traj.steps.append(
                StepRecord(
                    t=t,
                    prompt=items[k] if config.keep_prompts else None,
                    completion=comps[k],
                    texts=common.completion_texts(tokenizer, comps[k]),
                    action=action,
                    golden=steps[k].action,
                    reward=reward,
                    thumb=screen_thumbnail(images[k], config.thumb_size),
                    app=screen.app,
                    page=screen.page,
                )
            )
            if action.parsed:  # an unparsable completion is a no-op: the world is not touched
                _, done = world.step(action)
                histories[i].append(format_action(action))
                if done:
                    traj.stopped = True
                    traj.success = bool(is_done(world, tasks[i].task))
                    traj.terminal_reward = config.settings.success_reward if traj.success else 0.0
                    continue
            if t + 1 >= tasks[i].step_limit:
                traj.truncated = True
                continue
            still.append(i)
        active = still
        t += 1
    return trajs


def rollout_summary(trajs: Sequence[Trajectory]) -> dict:
    """Success rate, mean steps, truncations and wrong stops over finished episodes; unparsable steps, mean reward,
    env steps over all steps; ``budget_cut`` episodes."""
    n = len(trajs)
    if n == 0:
        return {"episodes": 0, "success_rate": None, "mean_steps": None}
    ended = [tr for tr in trajs if not tr.cut]
    ok = [tr.num_steps for tr in ended if tr.success]
    all_steps = [s for tr in trajs for s in tr.steps]

    def rate(values):
        return float(np.mean(values)) if ended else None

    return {
        "episodes": n,
        "success_rate": rate([tr.success for tr in ended]),
        "mean_steps": rate([tr.num_steps for tr in ended]),
        "mean_steps_success": float(np.mean(ok)) if ok else None,
        "truncated_rate": rate([tr.truncated for tr in ended]),
        "wrong_stop_rate": rate([tr.stopped and not tr.success for tr in ended]),
        "unparsable_rate": float(np.mean([not s.action.parsed for s in all_steps])) if all_steps else 0.0,
        "mean_step_reward": float(np.mean([s.reward for s in all_steps])) if all_steps else 0.0,
        "env_steps": len(all_steps),
        "budget_cut": int(sum(tr.cut for tr in trajs)),
    }
