"""The baselines' learners on the same core (method.md §11): GRPO with UI-R1's rule reward, and online PPO with
dense rewards in a live world (``envs.protocol``; GiGPPO's sibling-conditioned critic as a switch).
"""
