"""Whole episodes of a policy in several environments (``envs.protocol``: the synthetic world, AndroidWorld), for
online PPO / GiGPPO and ``eval.online``: one jitted sampler call for the episodes whose observation is ready, keys
from ``step_uid(name, t)`` (so a row's sample does not depend on which rows share its call); each episode ends at
STOP or its task's step limit, then is scored by its world. The slots are played by ``rl.episodes``: in-process
worlds in lockstep batches, networked ones each on its own thread, so one slow or dead server stalls no other.

Step rewards (leaf or UI-R1) are against the observation's expert action where the world has one, else 0; the
terminal reward is ``success_reward · score``. An ``EnvError`` of one environment ends only its own episode, recorded
as failed with the reason; the others go on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.actions import Action
from ipl_jax.coat.rewards import RewardConfig, encode_actions, encode_golden, leaf_rewards
from ipl_jax.data.dialogue import DEFAULT_PROMPTS, CoaTPrompts
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.envs.protocol import Env, EnvTask, Observation
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl import common
from ipl_jax.rl import rewards as rewards_lib
from ipl_jax.rl.advantages import screen_thumbnail
from ipl_jax.rl.episodes import NO_LIVE_SERVER as NO_LIVE_SERVER
from ipl_jax.rl.episodes import Slots, StepRecord, Trajectory
from ipl_jax.rl.sampling import Completion, tree_completions
from ipl_jax.rl.sections import PPOSettings
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.prompts import StepPrompts, pack_tree_prompts, step_prompts
from ipl_jax.sampling.tree_sampler import sample_tree


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are played: sampler (branching forced to (1, 1, 1, 1)), image_config, batch_size (episodes per
    sampler call, padded to it; in-process worlds: also the most played at once), settings (the ``rl.ppo``
    section: its step_reward and success_reward), thumb_size, keep_prompts, gather_seconds (networked slots: once one
    observation is ready, how long to wait for the others expected within it, so sampler calls stay full; a slot
    whose previous env calls took longer joins a later call)."""

    sampler: SamplerConfig
    image_config: ImageProcessorConfig
    batch_size: int = 8
    prompts: CoaTPrompts = DEFAULT_PROMPTS
    reward: RewardConfig = RewardConfig()
    settings: PPOSettings = PPOSettings()
    thumb_size: tuple[int, int] = (16, 32)
    keep_prompts: bool = True
    gather_seconds: float = 1.0

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"RolloutConfig.batch_size must be >= 1, got {self.batch_size}")
        if self.gather_seconds < 0:
            raise ValueError(f"RolloutConfig.gather_seconds must be >= 0, got {self.gather_seconds}")
        object.__setattr__(self, "sampler", self.sampler.replace(branching=(1, 1, 1, 1)))


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
    """Play every task to its end on the slots ``envs``; one ``Trajectory`` per task, in order. Each sampler call
    takes the episodes whose observation is ready (at most ``config.batch_size``, earliest task first).

    In-process worlds (``concurrent`` False) play in lockstep batches: ``min(batch_size, live slots)`` tasks at a
    time, the k-th on the k-th slot, every episode of the batch in each call. Networked slots play on their own: each
    runs its env calls in its own thread and, when its episode ends, starts the next task not yet started, so a slow
    server's episodes join later calls and hold no other server up (``RolloutConfig.gather_seconds``).

    ``max_env_steps`` cuts the episodes still running once that many actions were taken (the earliest tasks ready
    take what is left); an unparsable completion is a no-op with reward 0; an ``EnvError`` ends only its own episode
    (``error``). A slot whose error is ``down`` (its server gone) is dropped for the rest of the call: its running
    episode is recorded failed, a task it could not even start goes back to the front of the queue, and once no slot
    is live the tasks left are recorded failed (``NO_LIVE_SERVER``). ``on_done(trajectory)`` is called, in this
    thread, as each episode's record is final (a resumable caller appends it to its log)."""
    if not envs:
        raise ValueError("rollout: no environments to play")
    seed = common.key_seed(rng)
    settings = (config.batch_size, config.gather_seconds, config.settings.success_reward)
    with Slots(tasks, envs, *settings, on_done) as slots:
        while slots.deal():
            ready = slots.cut(slots.wait(), max_env_steps)[: config.batch_size]
            if ready:
                slots.advance(ready, _decide(ready, params, cfg, tokenizer, seed, config, mesh))
    return slots.trajectories()


def _decide(ready: list, params, cfg, tokenizer, seed, config: RolloutConfig, mesh) -> list[Action]:
    """One action for every ready episode (one sampler call), recorded in its trajectory."""
    eps = [s.ep for s in ready]
    obs = [e.obs for e in eps]
    steps = [_step_of(e.obs, e.traj.task, e.traj.num_steps, e.history) for e in eps]
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
    for k, (e, o, action) in enumerate(zip(eps, obs, actions)):
        e.traj.steps.append(
            StepRecord(
                t=steps[k].step_id,
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
    return actions


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
