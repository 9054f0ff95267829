"""Config sections the job configs share: the synthetic world's (``world``) and the RL learners' (``rl``).

Pure Python (no JAX): a config file builds them when it is loaded.
"""

import dataclasses

import ml_collections

from ipl_jax.data.synthetic.config import WorldConfig


def world_section(**overrides) -> ml_collections.ConfigDict:
    """The ``world`` section: every ``WorldConfig`` field with its default, then ``overrides``."""
    values = dataclasses.asdict(WorldConfig())
    unknown = set(overrides) - set(values)
    if unknown:
        raise ValueError(f"world_section: unknown WorldConfig fields {sorted(unknown)}")
    return ml_collections.ConfigDict({**values, **overrides})


def rl_section() -> ml_collections.ConfigDict:
    """The ``rl`` section: GRPO (UI-R1's values), PPO / GiGPPO and their rollouts (docs/method.md §11; the budget
    rule that makes one round of them comparable with a T-DPO round is ``pipeline/configs.py``'s)."""
    c = ml_collections.ConfigDict()
    c.grpo = g = ml_collections.ConfigDict()
    g.group_size = 8  # UI-R1
    g.style = "coat"  # coat | think_answer (UI-R1's <think>…</think><answer>…</answer> prompt)
    g.clip_eps = 0.2
    g.kl_beta = 0.04
    g.learning_rate = 1e-6
    g.dast = False
    g.prompts_per_batch = 4
    g.updates_per_batch = 1
    g.length_norm = "sequence"
    c.ppo = p = ml_collections.ConfigDict()
    p.gamma_dense = 0.5
    p.lam = 1.0
    p.kl_coef = 0.01
    p.value_clip = 0.5
    p.critic_warmup = 4
    p.policy_updates = 2
    p.policy_learning_rate = 1e-6
    p.critic_learning_rate = 1e-4
    p.tasks_per_batch = 4
    p.trajectories_per_task = 4
    p.minibatch_rows = 16
    p.success_reward = 1.0
    p.step_reward = "leaf"  # leaf (method.md §4) | uir1 (UI-R1's reward / 3)
    p.max_steps = 25  # the step-limit cap; the limit of a task is min(max_steps, ceil(step_factor x expert steps))
    p.step_factor = 2.0
    c.row_buckets = (384, 512, 640, 768)  # RL training rows (prompt + sampled CoaT)
    return c
