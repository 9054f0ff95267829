"""Online evaluation in a live world (``envs.protocol``: the synthetic world, AndroidWorld): the success rate (the
world's own score; synthetic: ``stop`` at the goal) with its 95% interval, mean steps, per-family rates and one
record per episode (its error, if an environment failed, and its wall time). Greedy by default; with a
temperature, ``samples_per_task`` episodes per task.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from ipl_jax.coat.rewards import RewardConfig
from ipl_jax.coat.tree import NUM_TURNS
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.envs.protocol import Env, EnvTask, replicate
from ipl_jax.rl.rollout import RolloutConfig, rollout, rollout_summary
from ipl_jax.sampling.config import SamplerConfig


@dataclasses.dataclass(frozen=True)
class OnlineEvalConfig:
    """rollout (``RolloutConfig``); temperature (0 = greedy); samples_per_task; keep_episodes (adds
    ``episodes_detail``)."""

    rollout: RolloutConfig
    temperature: float = 0.0
    samples_per_task: int = 1
    keep_episodes: bool = True

    def __post_init__(self):
        if self.samples_per_task < 1:
            raise ValueError(f"OnlineEvalConfig.samples_per_task must be >= 1, got {self.samples_per_task}")
        if self.temperature < 0:
            raise ValueError(f"OnlineEvalConfig.temperature must be >= 0, got {self.temperature}")


def _episode_record(tr) -> dict:
    return {
        "name": tr.task.name,
        "family": tr.task.family,
        "instruction": tr.goal,
        "success": bool(tr.success),
        "score": float(tr.score),
        "stopped": bool(tr.stopped),
        "truncated": bool(tr.truncated),
        "steps": tr.num_steps,
        "step_limit": tr.task.step_limit,
        "actions": [s.texts[2] for s in tr.steps],
        "rewards": [round(float(s.reward), 4) for s in tr.steps],
        "error": tr.error,
        "wall_s": round(float(tr.wall_s), 3),
    }


def online_eval(
    params: dict,
    cfg,
    tokenizer,
    world_tasks: Sequence[EnvTask],
    envs: Sequence[Env],
    rng,
    config: OnlineEvalConfig,
    mesh=None,
) -> dict:
    """Play every task ``samples_per_task`` times on ``envs`` and summarise (``rl.rollout.rollout_summary``:
    success_rate and success_ci95, mean_steps, truncated_rate, wrong_stop_rate, failed_episodes, ...; by_family;
    episodes_detail with ``keep_episodes``).
    """
    if not world_tasks:
        raise ValueError("online_eval: no tasks")
    t = float(config.temperature)
    rcfg = dataclasses.replace(
        config.rollout, keep_prompts=False, sampler=config.rollout.sampler.replace(temperature=(t,) * NUM_TURNS)
    )
    tasks = replicate(world_tasks, config.samples_per_task) if config.samples_per_task > 1 else list(world_tasks)
    trajs = rollout(params, cfg, tokenizer, tasks, envs, rng, rcfg, mesh)
    out = rollout_summary(trajs)
    fams = defaultdict(list)
    for tr in trajs:
        fams[tr.task.family].append(tr)
    out["by_family"] = {
        f: {
            "episodes": len(v),
            "success_rate": float(np.mean([tr.success for tr in v])),
            "mean_steps": float(np.mean([tr.num_steps for tr in v])),
        }
        for f, v in sorted(fams.items())
    }
    if config.keep_episodes:
        out["episodes_detail"] = [_episode_record(tr) for tr in trajs]
    return out


# ------------------------------------------------------------------------------------------------ job wiring


def online_config(
    sampler: SamplerConfig,
    image_config: ImageProcessorConfig,
    reward: RewardConfig,
    batch_size: int,
    temperature: float = 0.0,
    samples_per_task: int = 1,
) -> OnlineEvalConfig:
    """Online-evaluation settings: the job's ``sampler`` with patch buckets for ``batch_size`` screenshots, greedy by
    default, the leaf ``reward`` as step reward."""
    rc = RolloutConfig(sampler=sampler, image_config=image_config, batch_size=batch_size, reward=reward)
    return OnlineEvalConfig(rollout=rc, temperature=temperature, samples_per_task=samples_per_task)
