"""CoaT-tree sampling (docs/method.md §3): fixed-shape, prefix-sharing, one compilation per shape configuration.
``step_prompts`` / ``pack_tree_prompts`` on the host, then ``sample_tree`` -> a ``CoaTTree``.
"""

from ipl_jax.sampling.batches import SampledBatch, iter_sampled_batches
from ipl_jax.sampling.config import SamplerConfig, greedy_config
from ipl_jax.sampling.keys import node_keys, step_keys, step_uid
from ipl_jax.sampling.no_sharing import sample_tree_no_sharing
from ipl_jax.sampling.prompts import StepPrompts, TreePrompts, pack_tree_prompts, step_prompts
from ipl_jax.sampling.token_sampling import filter_logits, sample_tokens
from ipl_jax.sampling.tree_sampler import sample_tree

__all__ = [
    "SampledBatch",
    "iter_sampled_batches",
    "SamplerConfig",
    "greedy_config",
    "node_keys",
    "step_keys",
    "step_uid",
    "sample_tree_no_sharing",
    "StepPrompts",
    "TreePrompts",
    "pack_tree_prompts",
    "step_prompts",
    "filter_logits",
    "sample_tokens",
    "sample_tree",
]
