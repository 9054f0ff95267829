"""Whole episodes of a policy in a batch of environments (``envs.protocol``: the synthetic world, AndroidWorld),
for online PPO / GiGPPO and ``eval.online``: one jitted sampler call per step over the episodes still running, keys
from ``step_uid(name, t)``; each episode ends at STOP or its task's step limit, then is scored by its world.

Step rewards (leaf or UI-R1) are against the observation's expert action where the world has one, else 0; the
terminal reward is ``success_reward · score``. An ``EnvError`` of one environment ends only its own episode, recorded
as failed with the reason; the others go on.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.actions import Action, format_action
from ipl_jax.coat.rewards import RewardConfig, encode_actions, encode_golden, leaf_rewards
from ipl_jax.data.dialogue import DEFAULT_PROMPTS, CoaTPrompts
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.envs.protocol import Env, EnvError, EnvTask, Observation, each, is_concurrent
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
class RolloutConfig:
    """How episodes are played: sampler (branching forced to (1, 1, 1, 1)), image_config, batch_size (episodes per
    sampler call, padded to it; at most one per environment), settings (the ``rl.ppo`` section: its step_reward and
    success_reward), thumb_size, keep_prompts."""

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
    """One environment step: prompt (if kept), completion, turn texts, parsed and expert (None: the world has none)
    actions, reward, thumbnail, and the screen's app / page where the world says."""

    t: int
    prompt: StepPrompts | None
    completion: Completion
    texts: list
    action: Action
    golden: Action | None
    reward: float
    thumb: np.ndarray
    app: str
    page: str


@dataclasses.dataclass
class Trajectory:
    """One episode: task, goal, steps, and outcome: ``stopped``, ``score`` (the world's, in [0, 1]), ``success``
    (score 1: for the synthetic world, stopped at the goal), ``truncated`` (step limit), ``cut`` (budget ran out,
    outcome unknown), ``error`` (an ``EnvError`` ended it: failed, outcome unknown), ``wall_seconds`` (seconds from its
    batch's start to its end)."""

    task: EnvTask
    goal: str = ""
    steps: list = dataclasses.field(default_factory=list)
    stopped: bool = False
    success: bool = False
    truncated: bool = False
    terminal_reward: float = 0.0
    cut: bool = False
    score: float = 0.0
    error: str | None = None
    wall_seconds: float = 0.0

    @property
    def unknown(self) -> bool:
        """Its return is unknown (cut by the budget, or ended by an environment's failure): nothing to learn from."""
        return self.cut or self.error is not None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def step_rewards(self) -> np.ndarray:
        return np.asarray([s.reward for s in self.steps], np.float32)


_NO_EXPERT = Action(type="wait")  # the golden turn a world without an expert gives the prompt builder (unscored)


def _step_of(obs: Observation, task: EnvTask, t: int, history: Sequence[str]) -> Step:
    """The ``Step`` a prompt (and a scripted stand-in policy) reads: the observation's goal, screen and expert."""
    image = obs.image
    return Step(
        episode_id=task.name,
        step_id=t,
        instruction=obs.goal,
        image=lambda: image,
        screen_size=tuple(obs.screen_size),
        action=obs.expert if obs.expert is not None else _NO_EXPERT,
        history=tuple(history),
        elements=tuple(obs.elements),
        meta=dict(obs.meta),
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


NO_LIVE_SERVER = "no live server"  # the error of the episodes left when every environment is down


def rollout(
    params: dict,
    cfg: Qwen2VLConfig,
    tokenizer,
    tasks: Sequence[EnvTask],
    envs: Sequence[Env],
    rng,
    config: RolloutConfig,
    mesh=None,
    max_env_steps: int | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Play every task to its end, ``min(config.batch_size, live slots)`` at a time, the k-th task of a batch on the
    k-th live slot; one ``Trajectory`` per task, in order. ``max_env_steps`` cuts episodes still running; an
    unparsable completion is a no-op with reward 0; an ``EnvError`` ends only its own episode (``error``).

    A slot whose error is ``down`` (its server gone) is dropped for the rest of the call: its running episode is
    recorded failed, a task it could not even start goes back to the front of the queue for the live slots, and
    once no slot is live the tasks left are recorded failed (``NO_LIVE_SERVER``). In-process worlds never go down,
    so their batches are exactly the fixed ones. ``on_done(trajectory)`` is called as each episode's record is
    final (a resumable caller appends it to its log)."""
    if not envs:
        raise ValueError("rollout: no environments to play")
    seed = common.key_seed(rng)
    live = list(range(len(envs)))
    queue = list(range(len(tasks)))  # task indexes not yet played, in order
    out: dict[int, Trajectory] = {}
    last_down = ""
    while queue:
        if not live:
            for j in queue:
                out[j] = Trajectory(
                    task=tasks[j], error=f"{NO_LIVE_SERVER} ({last_down})" if last_down else NO_LIVE_SERVER
                )
                if on_done is not None:
                    on_done(out[j])
            break
        width = min(config.batch_size, len(live))
        batch, queue = queue[:width], queue[width:]
        slots = live[: len(batch)]
        left = None if max_env_steps is None else max_env_steps - sum(tr.num_steps for tr in out.values())
        play = _Play([tasks[j] for j in batch], [envs[s] for s in slots], config, on_done)
        _rollout_batch(play, params, cfg, tokenizer, seed, mesh, left)
        for k, j in enumerate(batch):
            if k not in play.unstarted:
                out[j] = play.trajs[k]
        queue = [batch[k] for k in sorted(play.unstarted)] + queue
        if play.down:
            last_down = play.trajs[min(play.down)].error or ""
            live = [s for s in live if s not in {slots[k] for k in play.down}]
    return [out[j] for j in range(len(tasks))]


class _Play:
    """One batch of episodes in play: slot i plays ``tasks[i]`` on ``envs[i]``; a slot's ``EnvError`` ends its
    episode (recorded, its env closed) and no other; a ``down`` one marks the slot dead (``down``), and where it
    came at the reset the task is handed back unplayed (``unstarted``)."""

    def __init__(self, tasks: list[EnvTask], envs: list[Env], config: RolloutConfig, on_done=None):
        self.tasks, self.envs, self.config, self.on_done = tasks, envs, config, on_done
        self.concurrent = is_concurrent(envs)
        self.trajs = [Trajectory(task=task) for task in tasks]
        self.histories: list[list[str]] = [[] for _ in tasks]
        self.obs: list[Observation | None] = [None] * len(tasks)
        self.closed: set[int] = set()
        self.down: set[int] = set()
        self.unstarted: set[int] = set()
        self.t0 = time.perf_counter()

    def each(self, fn, slots: list[int], starting: bool = False) -> dict:
        """{slot: fn(slot)} for the slots whose call succeeded; the others failed (``fail``)."""
        out = {}
        for i, r in zip(slots, each(fn, slots, self.concurrent)):
            if isinstance(r, EnvError):
                self.fail(i, r, starting)
            else:
                out[i] = r
        return out

    def fail(self, i: int, err: EnvError, starting: bool = False) -> None:
        self.trajs[i].error = str(err).splitlines()[0] if str(err) else type(err).__name__
        if getattr(err, "down", False):  # nothing to tear down on a server that is gone
            self.down.add(i)
            self.closed.add(i)
            if starting:
                self.unstarted.add(i)
            else:
                self._end(i, time.perf_counter())
            return
        self.close([i])

    def finish(self, slots: list[int]) -> None:
        """Score the ended episodes (terminal reward ``success_reward · score``; success: score 1), then close."""
        for i, score in self.each(lambda i: self.envs[i].score(), slots).items():
            tr = self.trajs[i]
            tr.score = float(score)
            tr.success = tr.score >= 1.0
            tr.terminal_reward = self.config.settings.success_reward * tr.score
        self.close(slots)

    def close(self, slots: list[int]) -> None:
        slots = [i for i in slots if i not in self.closed]
        self.closed.update(slots)
        each(lambda i: self.envs[i].close(), slots, self.concurrent)  # a failing close loses nothing recorded
        now = time.perf_counter()
        for i in slots:
            self._end(i, now)

    def _end(self, i: int, now: float) -> None:
        self.trajs[i].wall_seconds = now - self.t0
        if self.on_done is not None:
            self.on_done(self.trajs[i])


def _rollout_batch(play: _Play, params, cfg, tokenizer, seed, mesh, budget=None) -> None:
    tasks, envs = play.tasks, play.envs
    for i, o in play.each(lambda i: envs[i].reset(tasks[i]), list(range(len(tasks))), starting=True).items():
        play.obs[i], play.trajs[i].goal = o, o.goal
    active = sorted(i for i, o in enumerate(play.obs) if o is not None)
    t = 0
    while active:
        if budget is not None:  # the first episodes still running take what is left; the rest are cut unfinished
            left = max(0, budget - sum(tr.num_steps for tr in play.trajs))
            for i in active[left:]:
                play.trajs[i].cut = True
            play.close(active[left:])
            active = active[:left]
        need = [i for i in active if play.obs[i] is None]
        for i, o in play.each(lambda i: envs[i].observe(), need).items():
            play.obs[i] = o
        active = [i for i in active if play.trajs[i].error is None]
        if not active:
            break
        active = _decide(play, params, cfg, tokenizer, active, t, seed, mesh)
        t += 1


def _decide(play: _Play, params, cfg, tokenizer, active: list[int], t: int, seed, mesh) -> list[int]:
    """One action for every active episode (one sampler call), applied; returns the episodes still running."""
    config = play.config
    obs = [play.obs[i] for i in active]
    steps = [_step_of(o, play.tasks[i], t, play.histories[i]) for i, o in zip(active, obs)]
    items = [
        step_prompts(s, tokenizer, config.image_config, cfg, config.prompts, image=o.image) for s, o in zip(steps, obs)
    ]
    comps = act(params, cfg, items, steps, seed, config, mesh)
    parsed = [common.parse_completion(tokenizer, c, "coat") for c in comps]
    actions = [a for a, _, _ in parsed]
    scored = [o.expert is not None for o in obs]  # a world without an expert gives no step reward
    r = (
        _step_rewards(actions, [ok for _, ok, _ in parsed], steps, config, config.batch_size)
        if any(scored)
        else np.zeros(len(actions), np.float32)
    )
    for k, (i, o, action) in enumerate(zip(active, obs, actions)):
        play.trajs[i].steps.append(
            StepRecord(
                t=t,
                prompt=items[k] if config.keep_prompts else None,
                completion=comps[k],
                texts=common.completion_texts(tokenizer, comps[k]),
                action=action,
                golden=o.expert,
                reward=float(r[k]) if action.parsed and scored[k] else 0.0,
                thumb=screen_thumbnail(o.image, config.thumb_size),
                app=str(o.meta.get("app", "")),
                page=str(o.meta.get("page", "")),
            )
        )
    chosen = dict(zip(active, actions))
    moved = [i for i in active if chosen[i].parsed]  # an unparsable completion is a no-op: the world is not touched
    done = play.each(lambda i: play.envs[i].act(chosen[i]), moved)
    for i in done:
        play.histories[i].append(format_action(chosen[i]))
        play.obs[i] = None
    ended, still = [], []
    for i in active:
        tr = play.trajs[i]
        if tr.error is not None:
            continue
        if done.get(i):
            tr.stopped = True
            ended.append(i)
        elif t + 1 >= play.tasks[i].step_limit:
            tr.truncated = True
            ended.append(i)
        else:
            still.append(i)
    play.finish(ended)
    return still


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of a success rate (95% at z = 1.96; sound at 0 / n and n / n, unlike the normal
    approximation); None for n = 0."""
    if n <= 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rollout_summary(trajs: Sequence[Trajectory]) -> dict:
    """Success rate (with its 95% Wilson interval ``success_ci95``), mean score, mean steps, truncations and wrong
    stops over the episodes not cut by the budget (one ended by an environment's failure counts as a failure, and
    in ``failed_episodes`` with its reason in ``errors``); unparsable steps, mean reward, env steps over all steps;
    ``budget_cut`` episodes; ``mean_wall_seconds`` per episode."""
    n = len(trajs)
    if n == 0:
        return {"episodes": 0, "success_rate": None, "mean_steps": None}
    ended = [tr for tr in trajs if not tr.cut]
    ok = [tr.num_steps for tr in ended if tr.success]
    all_steps = [s for tr in trajs for s in tr.steps]
    ci = wilson_interval(len(ok), len(ended))

    def rate(values):
        return float(np.mean(values)) if ended else None

    return {
        "episodes": n,
        "success_rate": rate([tr.success for tr in ended]),
        "success_ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
        "mean_score": rate([tr.score for tr in ended]),
        "mean_steps": rate([tr.num_steps for tr in ended]),
        "mean_steps_success": float(np.mean(ok)) if ok else None,
        "truncated_rate": rate([tr.truncated for tr in ended]),
        "wrong_stop_rate": rate([tr.stopped and not tr.success for tr in ended]),
        "unparsable_rate": float(np.mean([not s.action.parsed for s in all_steps])) if all_steps else 0.0,
        "mean_step_reward": float(np.mean([s.reward for s in all_steps])) if all_steps else 0.0,
        "env_steps": len(all_steps),
        "budget_cut": int(sum(tr.cut for tr in trajs)),
        "failed_episodes": int(sum(tr.error is not None for tr in trajs)),
        "errors": {tr.task.name: tr.error for tr in trajs if tr.error is not None},
        "mean_wall_seconds": round(float(np.mean([tr.wall_seconds for tr in trajs])), 3),
    }
