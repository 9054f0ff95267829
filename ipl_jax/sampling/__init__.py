"""CoaT-tree sampling (docs/method.md §3): fixed-shape, prefix-sharing, one compilation per shape configuration.

    from ipl_jax.sampling import SamplerConfig, step_prompts, pack_tree_prompts, sample_tree

    config = SamplerConfig.for_tokenizer(tokenizer, branching=(3, 3, 3, 1), max_turn_tokens=(256, 128, 32, 32))
    items = [step_prompts(step, tokenizer, image_config, cfg) for step in steps]     # host: segments + pixels
    prompts = pack_tree_prompts(cfg, items, config, seed=0, batch_size=4)           # host: buckets, keys
    tree = sample_tree(params, cfg, prompts, config, mesh=None)                     # device: a CoaTTree

Modules: ``config`` (SamplerConfig), ``keys`` (step / node / position keys), ``token_sampling`` (temperature,
top-k, top-p, greedy), ``prompts`` (StepPrompts, TreePrompts), ``decoding`` (the shared decode loop),
``tree_sampler`` (prefix sharing), ``no_sharing`` (the baseline), ``batches`` (step lists in batches),
``tree_records`` (texts, leaf actions, values, JSON).
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
