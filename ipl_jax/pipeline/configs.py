"""Library configs from the job's settings sections: the RL learners (``grpo_config``, ``ppo_config``, ...), the
seed selection's scoring (``seed_scoring``) and the equal budget that makes an RL
round comparable with a T-DPO round (``round_budget``: its sampled completions; GRPO whole groups of G, PPO
environment steps; no method exceeds it).
"""

from __future__ import annotations

from collections.abc import Sequence

from ipl_jax.coat.rewards import RewardConfig
from ipl_jax.coat.tree import num_leaves
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl.grpo import GRPOConfig
from ipl_jax.rl.ppo import PPOConfig
from ipl_jax.rl.rewards import UIR1RewardConfig
from ipl_jax.rl.rollout import RolloutConfig
from ipl_jax.rl.rows import RowConfig
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.settings import (
    BucketSettings,
    IPLSettings,
    PPOSettings,
    RLSettings,
)
from ipl_jax.training.state import Precision


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
        remat=precision.remat,
        compute_dtype=precision.compute_dtype,
        storage_dtype=precision.storage,
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
        remat=precision.remat,
        compute_dtype=precision.compute_dtype,
        storage_dtype=precision.storage,
    )


def rollout_config(
    ppo: PPOSettings, sampler: SamplerConfig, image_config: ImageProcessorConfig, reward: RewardConfig
) -> RolloutConfig:
    """PPO's ``RolloutConfig``: the job's sampler with patch buckets for ``ppo.worlds`` screenshots, its leaf reward."""
    return RolloutConfig(sampler=sampler, image_config=image_config, batch_size=ppo.worlds, reward=reward, settings=ppo)


def seed_scoring(settings) -> dict:
    """``eval.seed_selection.score_candidates``' sampler, reward, discount, seed and batch size as the job's
    settings (``Settings``) say."""
    return {
        "sampler_config": lambda tok: settings.sampler.build(tok.ids, settings.buckets, settings.eval.batch_size),
        "reward": settings.reward.build(settings.data.rules()),
        "discount": settings.reward.discount,
        "seed": settings.seed,
        "batch_size": settings.sampler.batch_size,
    }
