"""The other seeds' learners on the same core (method.md §11): GRPO with UI-R1's rule reward, and online PPO
with dense rewards in the live synthetic world, with GiGPPO's sibling-conditioned critic as a switch.

Modules: ``rewards`` (UI-R1's reward on device, DAST, NaN-safe group advantages, the think/answer format),
``sampling`` (G completions per prompt with the project's decode loop), ``rows`` (fixed-shape training rows and
their log-prob / hidden-state forwards), ``grpo`` (``grpo_step``, ``grpo_round``), ``rollout`` (episodes in a
batch of worlds), ``advantages`` (asymmetric GAE, GiGPPO's nearest siblings), ``critic`` (the separate critic),
``ppo`` (``ppo_step``, ``ppo_round``), ``job`` (the learners' configs from the job's settings, the equal budget).
"""
