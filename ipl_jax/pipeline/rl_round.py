"""One GRPO / PPO / GiGPPO round in the job's round loop (docs/method.md §11), spending a T-DPO round's budget of
sampled completions; its record adds ``samples``, ``budget`` and ``method``. Here too: the learners' configs from
the job's settings sections (``grpo_config``, ``ppo_config``, ...) and the equal budget that makes an RL round
comparable with a T-DPO round (``round_budget``: its sampled completions; GRPO whole groups of G, PPO environment
steps; no method exceeds it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import jax

from ipl_jax.coat.rewards import RewardConfig
from ipl_jax.coat.tree import num_leaves
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Episode, Step, sample_steps
from ipl_jax.envs import open_envs
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.pipeline.eval_stage import dev_accuracy, job_env_tasks
from ipl_jax.pipeline.model_stage import Policy, inference_policy, job_mesh, job_model_config, load_policy, write_round
from ipl_jax.pipeline.seeds import round_seed
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.rl import grpo, ppo
from ipl_jax.rl.grpo import GRPOConfig
from ipl_jax.rl.ppo import PPOConfig
from ipl_jax.rl.rewards import UIR1RewardConfig
from ipl_jax.rl.rollout import RolloutConfig
from ipl_jax.rl.rows import RowConfig
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.settings import BucketSettings, IPLSettings, PPOSettings, RLSettings, Settings
from ipl_jax.training.state import VISION_REGEX, Precision, model_params

# --------------------------------------------------------------------------------------- budget and configs


def round_budget(ipl: IPLSettings, branching: Sequence[int], n_train_steps: int | None = None) -> int:
    """Sampled completions of one T-DPO round of the job: its round's steps x the tree's leaves."""
    if n_train_steps is None and (ipl.round_fraction > 0 or ipl.steps_per_round == 0):
        raise ValueError(
            "round_budget: ipl.round_fraction is set or ipl.steps_per_round is 0 (all steps); pass the number of "
            "training steps"
        )
    return ipl.steps_in_round(n_train_steps or 0) * num_leaves(tuple(branching))


def grpo_prompts(budget: int, group_size: int) -> int:
    """GRPO prompts (steps) per round at ``budget`` completions: as many whole groups as fit (at least one)."""
    return max(1, budget // group_size)


def row_config(rl: RLSettings, buckets: BucketSettings, rows_per_batch: int, pad_id: int) -> RowConfig:
    """Training rows of ``rl.row_buckets``, with patch buckets for one screenshot and for a batch."""
    return RowConfig(
        text_buckets=rl.row_buckets,
        patch_buckets=tuple(sorted({p * n for p in buckets.patches for n in (1, rows_per_batch)})),
        pad_id=int(pad_id),
    )


def precision_fields(precision: Precision) -> dict:
    """What an RL learner's config takes from the job's precision: remat, compute and storage dtypes."""
    return {"remat": precision.remat, "compute_dtype": precision.compute_dtype, "storage_dtype": precision.storage}


def grpo_config(
    rl: RLSettings,
    buckets: BucketSettings,
    cfg: Qwen2VLConfig,
    pad_id: int,
    precision: Precision,
    rules: str,
    grad_clip: float,
) -> GRPOConfig:
    """``GRPOConfig`` of the job (``rl.grpo``, the data format's reward ``rules``, SFT's clipping, ``cfg``)."""
    return GRPOConfig(
        model=cfg,
        settings=rl.grpo,
        reward=UIR1RewardConfig(rules=rules),
        grad_clip_norm=grad_clip,
        rows=row_config(rl, buckets, rl.grpo.prompts_per_batch, pad_id),
        **precision_fields(precision),
    )


def ppo_config(
    rl: RLSettings,
    buckets: BucketSettings,
    cfg: Qwen2VLConfig,
    pad_id: int,
    precision: Precision,
    gigppo: bool,
    grad_clip: float,
) -> PPOConfig:
    """``PPOConfig`` of the job (its ``rl.ppo`` section, SFT's clipping); ``gigppo`` switches the sibling-conditioned
    critic."""
    return PPOConfig(
        model=cfg,
        settings=rl.ppo,
        gigppo=gigppo,
        grad_clip_norm=grad_clip,
        rows=row_config(rl, buckets, rl.ppo.minibatch_rows, pad_id),
        **precision_fields(precision),
    )


def rollout_config(
    ppo: PPOSettings, sampler: SamplerConfig, image_config: ImageProcessorConfig, reward: RewardConfig
) -> RolloutConfig:
    """PPO's ``RolloutConfig``: the job's sampler with patch buckets for ``ppo.worlds`` screenshots, its leaf reward."""
    return RolloutConfig(sampler=sampler, image_config=image_config, batch_size=ppo.worlds, reward=reward, settings=ppo)


# ------------------------------------------------------------------------------------------------ one round


def _scalars(metrics: dict) -> dict:
    """The round's update metrics without the per-batch lists (those stay out of round.json's summary)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool | int | float):
            out[k] = v
        elif isinstance(v, dict) and k == "train_episodes":
            out[k] = v
    return out


def round_grpo_config(settings: Settings, policy: Policy) -> GRPOConfig:
    """The round's ``GRPOConfig``: the ``rl.grpo`` section in the job's precision."""
    return grpo_config(
        settings.rl,
        settings.buckets,
        job_model_config(policy.cfg, settings.model),
        policy.tokenizer.ids.pad,
        settings.model.precision(),
        settings.data.rules(),
        settings.sft.grad_clip,
    )


def round_ppo_config(settings: Settings, policy: Policy, gigppo: bool) -> PPOConfig:
    """The round's ``PPOConfig``: the job's ``rl.ppo`` section in its precision (as ``round_grpo_config``)."""
    model = job_model_config(policy.cfg, settings.model)
    return ppo_config(
        settings.rl,
        settings.buckets,
        model,
        policy.tokenizer.ids.pad,
        settings.model.precision(),
        gigppo,
        settings.sft.grad_clip,
    )


def grpo_train(policy: Policy, settings: Settings, steps: Sequence[Step], rng, freeze):
    """GRPO over ``steps``. Returns (params, metrics, completions sampled)."""
    precision = settings.model.precision()
    gcfg = round_grpo_config(settings, policy)
    sampler = settings.sampler.build(
        policy.tokenizer.ids, settings.buckets, settings.eval.batch_size
    ).with_patch_buckets(settings.buckets.patch_buckets(gcfg.settings.prompts_per_batch))
    state = grpo.init_state(policy.params, gcfg, rng, freeze_regex=freeze, frozen_dtype=precision.frozen_dtype)
    state, m = grpo.grpo_round(
        state,
        None,
        steps,
        rng,
        gcfg,
        tokenizer=policy.tokenizer,
        image_config=policy.image_config,
        sampler=sampler,
        mesh=policy.mesh,
    )
    samples = int(sum(p["completions"] for p in m["per_step"]))
    m["steps"] = m["updates"]
    return model_params(state.params, state.frozen), m, samples


def ppo_train(policy: Policy, settings: Settings, budget: int, rng, freeze, gigppo: bool):
    """Online PPO (GiGPPO) until ``budget`` environment steps are spent; returns (params, metrics, steps used)."""
    p = settings.rl.ppo
    precision = settings.model.precision()
    pcfg = round_ppo_config(settings, policy, gigppo)
    tasks = job_env_tasks(settings, "train", max_steps=p.max_steps, step_factor=p.step_factor)
    sampler = settings.sampler.build(policy.tokenizer.ids, settings.buckets, settings.eval.batch_size)
    rcfg = rollout_config(
        p,
        sampler.with_patch_buckets(settings.buckets.patch_buckets(p.worlds)),
        policy.image_config,
        settings.reward.build(settings.data.rules()),
    )
    state = ppo.init_ppo_state(
        policy.params, pcfg, rng, policy_freeze_regex=freeze, frozen_dtype=precision.frozen_dtype
    )
    state, m = ppo.ppo_round(
        state,
        None,
        tasks,
        rng,
        pcfg,
        envs=open_envs(settings.env, p.worlds),
        tokenizer=policy.tokenizer,
        rollout_config=rcfg,
        env_steps=budget,
        mesh=policy.mesh,
    )
    m["steps"] = m["updates"]
    return model_params(state.policy.params, state.policy.frozen), m, int(m["env_steps"])


def run_rl_round(
    settings: Settings,
    wd: Workdir,
    round_index: int,
    start: Path,
    train_steps: Sequence[Step],
    dev_episodes: Sequence[Episode],
) -> dict:
    """One GRPO / PPO / GiGPPO round from policy directory ``start``; writes ``rounds/<r>/policy`` and
    ``round.json``, returns the round record."""
    s = settings.ipl  # the settings refuse ipl.lora_rank > 0 with these methods
    t0 = time.perf_counter()
    policy = load_policy(start, job_mesh(settings.mesh))
    budget = round_budget(s, settings.sampler.tree.branching, len(train_steps))
    rng = jax.random.PRNGKey(round_seed(settings.seed, round_index, "rng"))
    freeze = VISION_REGEX if s.freeze_vision else None
    if s.method == "grpo":
        n = grpo_prompts(budget, settings.rl.grpo.group_size)
        steps = sample_steps(train_steps, n, round_seed(settings.seed, round_index, "steps"))
        steps = (steps * -(-n // len(steps)))[:n]  # fewer training steps than prompts: visit them again
        params, metrics, samples = grpo_train(policy, settings, steps, rng, freeze)
    else:
        params, metrics, samples = ppo_train(policy, settings, budget, rng, freeze, gigppo=s.method == "gigppo")
    t_train = time.perf_counter() - t0
    record = {
        "round": round_index,
        "method": s.method,
        "pairs": 0,
        "classes": {},
        "samples": samples,
        "budget": budget,
        "train": _scalars(metrics),
    }
    t1 = time.perf_counter()
    record["dev"] = dev_accuracy(inference_policy(policy, settings.model, params), dev_episodes, settings)
    record["seconds"] = {
        "train": t_train,
        "evaluate": time.perf_counter() - t1,
        "total": time.perf_counter() - t0,
    }
    unit = "completions" if s.method == "grpo" else "environment steps"
    wd.echo(
        f"  round {round_index} ({s.method}): {samples} {unit} (budget {budget}), {metrics['updates']} updates, "
        f"dev step accuracy {record['dev']['step_accuracy']:.4f}, {record['seconds']['total']:.1f}s"
    )
    return write_round(wd, round_index, record, params, policy, start)
