"""The other seeds' learners on the same core (method.md §11): GRPO with UI-R1's rule reward, and online PPO
with dense rewards in the live synthetic world, with GiGPPO's sibling-conditioned critic as a switch.

Modules: ``rewards`` (UI-R1's reward on device, DAST, NaN-safe group advantages, the think/answer format),
``sampling`` (G completions per prompt with the project's decode loop), ``rows`` (fixed-shape training rows and
their log-prob / hidden-state forwards), ``grpo`` (``grpo_step``, ``grpo_round``), ``rollout`` (episodes in a
batch of worlds), ``advantages`` (asymmetric GAE, GiGPPO's nearest siblings), ``critic`` (the separate critic),
``ppo`` (``ppo_step``, ``ppo_round``), ``job`` (settings from a job config, the equal budget).

Layering: this room sits with ``preference`` / ``training``; it imports the model, data, coat and sampling rooms
below it, and ``eval.online`` (above) plays its rollouts for evaluation.
"""

from ipl_jax.rl.grpo import GRPOBatch, GRPOConfig, grpo_round, grpo_step
from ipl_jax.rl.ppo import PPOBatch, PPOConfig, PPOState, init_ppo_state, ppo_round, ppo_step
from ipl_jax.rl.rollout import RolloutConfig, WorldTask, rollout_summary, split_world_tasks

__all__ = [
    "GRPOBatch",
    "GRPOConfig",
    "grpo_round",
    "grpo_step",
    "PPOBatch",
    "PPOConfig",
    "PPOState",
    "init_ppo_state",
    "ppo_round",
    "ppo_step",
    "RolloutConfig",
    "WorldTask",
    "rollout_summary",
    "split_world_tasks",
]  # the episode player is ``rl.rollout.rollout`` (the module keeps its name)
