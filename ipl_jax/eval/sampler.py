"""Sampling scored CoaT-trees for dataset steps (the library behind ``ipl-jax sample``), one ``tree_record`` each."""

from __future__ import annotations

from ipl_jax.coat.rewards import RewardConfig
from ipl_jax.eval.trees import score_tree_batch
from ipl_jax.progress import progress
from ipl_jax.sampling.batches import iter_sampled_batches
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.tree_records import leaf_actions, tree_record, turn_texts


def sample_records(
    params,
    cfg,
    tokenizer,
    image_config,
    steps,
    config: SamplerConfig,
    seed: int,
    batch_size: int,
    mesh=None,
    rules: str = "aitz",
    discount: float = 0.95,
) -> tuple[list[dict], dict]:
    """One scored CoaT-tree per step (leaves vs the golden action under ``rules``, values backed up with
    ``discount``); returns (records, α/β/γ counts)."""
    reward_config = RewardConfig(rules=rules)
    records, counts = [], {"alpha": 0, "beta": 0, "gamma": 0}
    batches = iter_sampled_batches(params, cfg, tokenizer, image_config, steps, config, seed, batch_size, mesh)
    for batch in progress(batches, total=-(-len(steps) // batch_size), desc="sampling", unit="batch"):
        texts = turn_texts(batch.tree, tokenizer)
        actions = leaf_actions(texts)
        scores = score_tree_batch(actions, batch.steps, batch.tree.step_valid, reward_config, discount)
        for row in range(batch.num_valid):
            rec = tree_record(batch.tree, row, texts, actions, scores, batch.steps[row], discount)
            records.append(rec)
            counts[rec["class"]] += 1
    return records, counts
