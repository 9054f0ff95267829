"""The RL learners' settings sections (``rl.grpo``, ``rl.ppo``) and the names they accept, owned by the library:
``GRPOConfig``, ``PPOConfig`` and ``RolloutConfig`` hold them, the job's settings read them. Importing this module
loads no JAX (the optimizer settings are imported when asked for).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.sections import Section, is_nonneg, is_positive, one_of

GRPO_STYLES = ("coat", "think_answer")  # common.parse_completion's completion styles
LENGTH_NORMS = ("sequence", "token")  # common.sequence_weights' normalisations
STEP_REWARDS = ("leaf", "uir1")  # rollout._step_rewards' rewards of a step
PPO_WEIGHT_DECAY = 0.01  # AdamW's weight decay of the PPO policy and critic


def _constant(learning_rate: float, **kw):
    """``OptimizerSettings`` of a constant ``learning_rate`` (imported here: JAX loads when an optimizer is asked)."""
    from ipl_jax.training.optimizer import OptimizerSettings

    return OptimizerSettings(learning_rate=learning_rate, schedule="constant", **kw)


@dataclasses.dataclass(frozen=True)
class GRPOSettings(Section):
    """UI-R1's GRPO (docs/method.md §11): G completions per prompt, the clipped objective, the k3 KL."""

    PATH: ClassVar[str] = "rl.grpo"
    group_size: int = 8
    """Completions per prompt, G (UI-R1's)."""
    style: str = "coat"
    """coat | think_answer (UI-R1's <think>…</think><answer>…</answer> prompt)."""
    clip_eps: float = 0.2
    """ε of the token-level clipped objective."""
    kl_beta: float = 0.04
    """β of the k3 KL penalty to the reference."""
    learning_rate: float = 1e-6
    """Learning rate."""
    dast: bool = False
    """Add UI-R1-E's DAST length reward."""
    prompts_per_batch: int = 4
    """Prompts per sampled batch."""
    updates_per_batch: int = 1
    """Updates on each sampled batch."""
    length_norm: str = "sequence"
    """sequence | token: how a completion's token losses are averaged."""

    def __post_init__(self):
        self.at_least("group_size prompts_per_batch updates_per_batch", 1)
        self.need("style", self.style in GRPO_STYLES, one_of(GRPO_STYLES))
        self.need("length_norm", self.length_norm in LENGTH_NORMS, "must be sequence or token")
        for name in ("clip_eps", "learning_rate"):
            self.need(name, is_positive(getattr(self, name)), "must be > 0")
        self.need("kl_beta", is_nonneg(self.kl_beta), "must be >= 0")

    def optimizer(self, grad_clip_norm: float):
        """The policy's ``training.optimizer.OptimizerSettings``: a constant ``learning_rate``, clipped at
        ``grad_clip_norm`` (<= 0: no clipping)."""
        return _constant(self.learning_rate, grad_clip_norm=grad_clip_norm)


@dataclasses.dataclass(frozen=True)
class PPOSettings(Section):
    """Online PPO / GiGPPO with dense rewards in the live world (docs/method.md §11)."""

    PATH: ClassVar[str] = "rl.ppo"
    gamma_dense: float = 0.5
    """Discount of the dense step rewards (padding a trajectory with steps does not pay)."""
    lam: float = 1.0
    """GAE's λ."""
    kl_coef: float = 0.01
    """KL penalty to the reference."""
    value_clip: float = 0.5
    """Value clipping."""
    critic_warmup: int = 4
    """Critic updates before the policy moves."""
    policy_updates: int = 2
    """Policy updates per rollout batch."""
    policy_learning_rate: float = 1e-6
    """The policy's learning rate."""
    critic_learning_rate: float = 1e-4
    """The critic's learning rate."""
    tasks_per_batch: int = 4
    """Tasks per rollout batch."""
    trajectories_per_task: int = 4
    """Trajectories per task (GiGPPO's sibling states need >= 2)."""
    minibatch_rows: int = 16
    """Training rows per minibatch."""
    success_reward: float = 1.0
    """Reward of a finished task."""
    step_reward: str = "leaf"
    """leaf (docs/method.md §4) | uir1 (UI-R1's reward / 3)."""
    max_steps: int = 25
    """Step-limit cap: a task's limit is min(max_steps, ceil(step_factor x expert steps))."""
    step_factor: float = 2.0
    """The step limit's factor on the expert's steps."""

    def __post_init__(self):
        for name in ("gamma_dense", "lam"):
            self.need(name, is_nonneg(getattr(self, name)) and getattr(self, name) <= 1, "must be in [0, 1]")
        for name in ("kl_coef", "success_reward"):
            self.need(name, is_nonneg(getattr(self, name)), "must be >= 0")
        for name in ("value_clip", "policy_learning_rate", "critic_learning_rate", "step_factor"):
            self.need(name, is_positive(getattr(self, name)), "must be > 0")
        self.at_least("critic_warmup", 0)
        self.at_least("policy_updates tasks_per_batch trajectories_per_task minibatch_rows max_steps", 1)
        self.need("step_reward", self.step_reward in STEP_REWARDS, one_of(STEP_REWARDS))

    @property
    def worlds(self) -> int:
        """Live worlds per rollout batch."""
        return self.tasks_per_batch * self.trajectories_per_task

    def policy_optimizer(self, grad_clip_norm: float):
        """The policy's ``OptimizerSettings``: a constant ``policy_learning_rate``, AdamW's decay 0.01, clipped at
        ``grad_clip_norm`` (<= 0: no clipping)."""
        return _constant(self.policy_learning_rate, weight_decay=PPO_WEIGHT_DECAY, grad_clip_norm=grad_clip_norm)

    def critic_optimizer(self, grad_clip_norm: float):
        """The critic's ``OptimizerSettings``: a constant ``critic_learning_rate``, AdamW's decay 0.01, clipped at
        ``grad_clip_norm``."""
        return _constant(self.critic_learning_rate, weight_decay=PPO_WEIGHT_DECAY, grad_clip_norm=grad_clip_norm)
