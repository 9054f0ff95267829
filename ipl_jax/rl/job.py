"""The RL baselines' settings in a job config, and the budget that makes them comparable with a T-DPO round.

Equal budget (one round, any method) = the number of sampled completions of a T-DPO round:

    T-DPO:  steps_per_round trees x num_leaves(branching) leaves       (default 64 x 27 = 1728)
    GRPO:   floor(budget / G) prompts x G completions                  (G = 8: 216 steps x 8 = 1728)
    PPO:    budget environment steps, each one sampled CoaT completion (1728; rollout batches until the budget
            is spent, the one that reaches it cutting its unfinished episodes there: exactly the budget)

No method spends more than the budget: GRPO falls short by less than one group when G does not divide it (at
least one prompt is drawn, so a budget below G is passed), PPO not at all; the counts are reported.

A completion here is one full action decode (s1..s4). A T-DPO tree shares its prefixes (27 leaves cost 3 + 9 +
27 + 27 turn decodes, not 4 x 27), so at an equal number of completions T-DPO decodes fewer tokens; wall time is
reported next to the budget for that reason.

``rl_section()`` is the ``rl`` section a job config can carry (``config.rl``); the builders read it, falling
back to these defaults when the section is absent.
"""

from __future__ import annotations

import ml_collections

from ipl_jax.coat.tree import num_leaves
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl.grpo import GRPOConfig
from ipl_jax.rl.ppo import PPOConfig
from ipl_jax.rl.rewards import UIR1RewardConfig
from ipl_jax.rl.rollout import RolloutConfig
from ipl_jax.rl.rows import RowConfig
from ipl_jax.rl.section import rl_section
from ipl_jax.training.optimizer import OptimizerSettings


def _section(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    return config.rl if "rl" in config else rl_section()


def round_budget(config: ml_collections.ConfigDict, n_train_steps: int | None = None) -> int:
    """Sampled completions of one T-DPO round of the job: its round's steps x the tree's leaves."""
    n = int(config.ipl.steps_per_round)
    if float(config.ipl.round_fraction) > 0:
        if n_train_steps is None:
            raise ValueError("round_budget: ipl.round_fraction is set; pass the number of training steps")
        n = max(1, round(float(config.ipl.round_fraction) * n_train_steps))
    elif n == 0:
        if n_train_steps is None:
            raise ValueError("round_budget: ipl.steps_per_round is 0 (all steps); pass the number of training steps")
        n = n_train_steps
    return n * num_leaves(tuple(int(b) for b in config.sampler.branching))


def grpo_prompts(budget: int, group_size: int) -> int:
    """GRPO prompts (steps) per round at ``budget`` completions: as many whole groups as fit (at least one)."""
    return max(1, budget // group_size)


def _rows(config: ml_collections.ConfigDict, rows_per_batch: int, pad_id: int) -> RowConfig:
    per_image = tuple(int(p) for p in config.buckets.patches)
    return RowConfig(
        text_buckets=tuple(int(b) for b in _section(config).row_buckets),
        patch_buckets=tuple(sorted({p * n for p in per_image for n in (1, rows_per_batch)})),
        pad_id=int(pad_id),
    )


def grpo_config(config: ml_collections.ConfigDict, cfg: Qwen2VLConfig, pad_id: int, **precision) -> GRPOConfig:
    """``GRPOConfig`` of the job (its ``rl.grpo`` section, the reward rules of its data format). ``cfg``: the model
    config in the job's compute dtype; ``precision``: remat, compute_dtype, storage_dtype (the job's, as
    ``pipeline.model_stage.job_train_precision`` reads them)."""
    g = _section(config).grpo
    b = int(g.prompts_per_batch)
    return GRPOConfig(
        **precision,
        model=cfg,
        group_size=int(g.group_size),
        style=str(g.style),
        reward=UIR1RewardConfig(rules=_rules(config), dast=bool(g.dast)),
        clip_eps=float(g.clip_eps),
        kl_beta=float(g.kl_beta),
        length_norm=str(g.length_norm),
        updates_per_batch=int(g.updates_per_batch),
        prompts_per_batch=b,
        optimizer=OptimizerSettings(
            learning_rate=float(g.learning_rate), schedule="constant", grad_clip_norm=float(config.sft.grad_clip)
        ),
        rows=_rows(config, b, pad_id),
    )


def ppo_config(
    config: ml_collections.ConfigDict, cfg: Qwen2VLConfig, pad_id: int, gigppo: bool = False, **precision
) -> PPOConfig:
    """``PPOConfig`` of the job (its ``rl.ppo`` section); ``gigppo`` switches the sibling-conditioned critic;
    ``cfg`` and ``precision`` as in ``grpo_config``."""
    p = _section(config).ppo
    m = int(p.minibatch_rows)
    return PPOConfig(
        **precision,
        model=cfg,
        gigppo=gigppo,
        gamma_dense=float(p.gamma_dense),
        lam=float(p.lam),
        kl_coef=float(p.kl_coef),
        value_clip=float(p.value_clip),
        critic_warmup=int(p.critic_warmup),
        policy_updates=int(p.policy_updates),
        tasks_per_batch=int(p.tasks_per_batch),
        trajectories_per_task=int(p.trajectories_per_task),
        minibatch_rows=m,
        policy_optimizer=OptimizerSettings(
            learning_rate=float(p.policy_learning_rate), schedule="constant", weight_decay=0.01
        ),
        critic_optimizer=OptimizerSettings(
            learning_rate=float(p.critic_learning_rate), schedule="constant", weight_decay=0.01
        ),
        rows=_rows(config, m, pad_id),
    )


def rollout_config(config: ml_collections.ConfigDict, sampler, image_config, reward) -> RolloutConfig:
    """PPO's ``RolloutConfig``: ``sampler`` = the job's sampling settings (``eval.trees.sampler_config``),
    ``reward`` = its leaf ``RewardConfig`` (``eval.trees.reward_config``)."""
    p = _section(config).ppo
    worlds = int(p.tasks_per_batch) * int(p.trajectories_per_task)
    return RolloutConfig(
        sampler=sampler_for_batch(config, sampler, worlds),
        image_config=image_config,
        batch_size=worlds,
        reward=reward,
        step_reward=str(p.step_reward),
        success_reward=float(p.success_reward),
    )


def sampler_for_batch(config: ml_collections.ConfigDict, sampler, batch_size: int):
    """``sampler`` with patch buckets for ``batch_size`` screenshots per call (the job's per-image buckets x
    batch_size) added."""
    extra = tuple(int(p) * int(batch_size) for p in config.buckets.patches)
    return sampler.replace(patch_buckets=tuple(sorted(set(sampler.patch_buckets) | set(extra))))


def _rules(config: ml_collections.ConfigDict) -> str:
    from ipl_jax.coat.metrics import DEFAULT_RULES

    fmt = str(config.data.format)
    return DEFAULT_RULES["aitz" if fmt == "synthetic" else fmt]
