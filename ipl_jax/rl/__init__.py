"""The other seeds' learners on the same core (method.md §11): GRPO with UI-R1's rule reward, and online PPO
with dense rewards in the live synthetic world, with GiGPPO's sibling-conditioned critic as a switch.

Modules: ``rewards`` (UI-R1's reward on device, DAST, NaN-safe group advantages, the think/answer format),
``sampling`` (G completions per prompt with the project's decode loop), ``rows`` (fixed-shape training rows and
their log-prob / hidden-state forwards), ``grpo`` (``grpo_step``, ``grpo_round``), ``rollout`` (episodes in a
batch of worlds), ``advantages`` (asymmetric GAE, GiGPPO's nearest siblings), ``critic`` (the separate critic),
``ppo`` (``ppo_step``, ``ppo_round``), ``job`` (settings from a job config, the equal budget).

Layering: this room sits with ``preference`` / ``training``; it imports the model, data, coat and sampling rooms
below it, and ``eval.online`` (above) plays its rollouts for evaluation. The names below load on first use, so
that ``rl.section`` (the config section) can be imported without JAX.
"""

import importlib

_HOMES = {
    "GRPOBatch": "grpo",
    "GRPOConfig": "grpo",
    "grpo_round": "grpo",
    "grpo_step": "grpo",
    "PPOBatch": "ppo",
    "PPOConfig": "ppo",
    "PPOState": "ppo",
    "init_ppo_state": "ppo",
    "ppo_round": "ppo",
    "ppo_step": "ppo",
    "RolloutConfig": "rollout",
    "WorldTask": "rollout",
    "rollout_summary": "rollout",
    "split_world_tasks": "rollout",
}  # the episode player is ``rl.rollout.rollout`` (the module keeps its name)
__all__ = list(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"ipl_jax.rl.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'ipl_jax.rl' has no attribute {name!r}")
