"""The ``rl`` section of a job config (``config.rl``): GRPO, PPO / GiGPPO and their rollouts. Kept apart from
``rl.job`` so that a config file can build it without importing JAX."""

from __future__ import annotations

import ml_collections


def rl_section() -> ml_collections.ConfigDict:
    """Defaults of the ``rl`` config section (GRPO, PPO / GiGPPO, their rollouts)."""
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
