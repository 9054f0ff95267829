"""The RL learners' sections (``rl``: ``rl.grpo``, ``rl.ppo`` and their training rows), run by ``ipl.method``
grpo | ppo | gigppo.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.settings.base import Section, _nonneg, _one_of, _positive


@dataclasses.dataclass(frozen=True)
class GRPOSettings(Section):
    """UI-R1's GRPO (docs/method.md §11): G completions per prompt, the clipped objective, the k3 KL."""

    PATH: ClassVar[str] = "rl.grpo"
    group_size: int
    style: str
    clip_eps: float
    kl_beta: float
    learning_rate: float
    dast: bool
    prompts_per_batch: int
    updates_per_batch: int
    length_norm: str

    def __post_init__(self):
        from ipl_jax.rl.common import GRPO_STYLES, LENGTH_NORMS  # see the names above

        self.at_least("group_size prompts_per_batch updates_per_batch", 1)
        self.need("style", self.style in GRPO_STYLES, _one_of(GRPO_STYLES))
        self.need("length_norm", self.length_norm in LENGTH_NORMS, "must be sequence or token")
        for name in ("clip_eps", "learning_rate"):
            self.need(name, _positive(getattr(self, name)), "must be > 0")
        self.need("kl_beta", _nonneg(self.kl_beta), "must be >= 0")


@dataclasses.dataclass(frozen=True)
class PPOSettings(Section):
    """Online PPO / GiGPPO with dense rewards in the live world (docs/method.md §11)."""

    PATH: ClassVar[str] = "rl.ppo"
    gamma_dense: float
    lam: float
    kl_coef: float
    value_clip: float
    critic_warmup: int
    policy_updates: int
    policy_learning_rate: float
    critic_learning_rate: float
    tasks_per_batch: int
    trajectories_per_task: int
    minibatch_rows: int
    success_reward: float
    step_reward: str
    max_steps: int
    step_factor: float

    def __post_init__(self):
        from ipl_jax.rl.rollout import STEP_REWARDS  # see the names above

        for name in ("gamma_dense", "lam"):
            self.need(name, _nonneg(getattr(self, name)) and getattr(self, name) <= 1, "must be in [0, 1]")
        for name in ("kl_coef", "success_reward"):
            self.need(name, _nonneg(getattr(self, name)), "must be >= 0")
        for name in ("value_clip", "policy_learning_rate", "critic_learning_rate", "step_factor"):
            self.need(name, _positive(getattr(self, name)), "must be > 0")
        self.at_least("critic_warmup", 0)
        self.at_least("policy_updates tasks_per_batch trajectories_per_task minibatch_rows max_steps", 1)
        self.need("step_reward", self.step_reward in STEP_REWARDS, _one_of(STEP_REWARDS))

    @property
    def worlds(self) -> int:
        """Live worlds per rollout batch."""
        return self.tasks_per_batch * self.trajectories_per_task


@dataclasses.dataclass(frozen=True)
class RLSettings(Section):
    PATH: ClassVar[str] = "rl"
    grpo: GRPOSettings
    ppo: PPOSettings
    row_buckets: tuple[int, ...]

    def __post_init__(self):
        self.need(
            "row_buckets",
            bool(self.row_buckets) and min(self.row_buckets) >= 1,
            "must be one or more lengths >= 1 (training rows: prompt + sampled CoaT)",
        )
