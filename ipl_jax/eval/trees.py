"""Sampled CoaT-trees for the job's stages: tree batches of a policy, leaf scoring, and the adapters a round reads
(``SampledTrees`` / ``TreeScores``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ipl_jax.coat.actions import format_action, format_grounding, needs_grounding, thought_names_action
from ipl_jax.coat.rewards import (
    RewardConfig,
    backup_values,
    encode_actions,
    encode_golden,
    leaf_rewards,
    reshape_leading,
)
from ipl_jax.data.records import Step
from ipl_jax.data.tokenizer import IM_END
from ipl_jax.preference.pairs import action_type_id, classify_trees
from ipl_jax.preference.round import SampledTrees, TreeScores
from ipl_jax.sampling import tree_records
from ipl_jax.sampling.batches import iter_sampled_batches


def iter_tree_batches(policy, steps: Sequence[Step], sconfig, seed: int, batch_size: int):
    """``sampling.iter_sampled_batches`` for a ``Policy`` (on its mesh): one tree per step, fixed-shape batches."""
    return iter_sampled_batches(
        policy.params,
        policy.cfg,
        policy.tokenizer,
        policy.image_config,
        steps,
        sconfig,
        seed,
        batch_size,
        getattr(policy, "mesh", None),
    )


def score_tree_batch(
    actions: np.ndarray, steps: Sequence[Step], step_valid, reward_config=None, discount: float = 0.95
):
    """Leaf rewards against each row's golden step, value backup and classes, as ``tree_records.TreeRewards``.
    actions: object [B, b1..b4]; steps: B golden steps; discount: c of docs/method.md §5.
    """
    b = actions.shape[0]
    branching = actions.shape[1:]
    pred = reshape_leading(encode_actions(list(actions.reshape(-1))), actions.shape)
    gold = encode_golden(list(steps))
    rewards = leaf_rewards(pred, gold, reward_config or RewardConfig())
    values = np.asarray(rewards.value, np.float32)
    nodes = tuple(np.asarray(v) for v in backup_values(values, branching, discount))
    classes = np.asarray(classify_trees(values.reshape(b, -1), np.asarray(step_valid, bool)))
    return tree_records.TreeRewards(
        leaf_values=values, exact=np.asarray(rewards.exact, bool), node_values=nodes, classes=classes
    )


def score_batch(batch, texts: Sequence[np.ndarray], reward: RewardConfig, discount: float):
    """(leaf actions [B, b1..b4], ``tree_records.TreeRewards``) of a sampled batch."""
    actions = tree_records.leaf_actions(texts)
    scores = score_tree_batch(actions, batch.steps, np.asarray(batch.tree.step_valid, bool), reward, discount)
    return actions, scores


def round_scores(batch, texts: Sequence[np.ndarray], actions: np.ndarray, scores):
    """The round's ``TreeScores``: node values, type ids, whether each sampled s3 equals the golden text and whether
    each sampled thought names the golden action."""
    leaf_types = np.vectorize(action_type_id, otypes=[np.int32])(actions)
    golden_types = np.array([action_type_id(s.action) for s in batch.steps], np.int32)
    golden_s3 = [format_action(s.action) for s in batch.steps]
    s3 = texts[2]
    matches = np.zeros(s3.shape, bool)
    for idx in np.ndindex(*s3.shape):
        matches[idx] = _same_text(s3[idx], golden_s3[idx[0]])
    s2 = texts[1]
    names = np.zeros(s2.shape, bool)
    for idx in np.ndindex(*s2.shape):
        names[idx] = thought_names_action(s2[idx], batch.steps[idx[0]].action)
    return TreeScores(
        node_values=tuple(np.asarray(v) for v in scores.node_values),
        leaf_types=leaf_types,
        golden_types=golden_types,
        action_text_matches_golden=matches,
        thought_names_golden=names,
    )


@dataclasses.dataclass(frozen=True)
class LeafTally:
    """Counts over some steps' sampled trees (padding excluded): leaves, exact (sampled pass@1), consistent (named by
    their own thought; unparsed counts as not), thoughts, naming_golden.
    """

    leaves: int = 0
    exact: int = 0
    consistent: int = 0
    thoughts: int = 0
    naming_golden: int = 0

    def __add__(self, other: LeafTally) -> LeafTally:
        return LeafTally(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def figures(self) -> dict:
        """pass_at_1, consistency (per leaf), thought_names_golden (per thought); None without leaves."""

        def share(k: int, n: int) -> float | None:
            return k / n if n else None

        return {
            "pass_at_1": share(self.exact, self.leaves),
            "consistency": share(self.consistent, self.leaves),
            "thought_names_golden": share(self.naming_golden, self.thoughts),
        }


def leaf_consistency(thoughts: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """bool[B, b1, b2, b3, b4]: whether each leaf's action is named by its own thought (texts [B, b1, b2])."""
    out = np.zeros(actions.shape, bool)
    for idx in np.ndindex(*actions.shape):
        out[idx] = thought_names_action(str(thoughts[idx[:3]]), actions[idx])
    return out


def row_tallies(
    texts: Sequence[np.ndarray], actions: np.ndarray, exact: np.ndarray, steps: Sequence[Step], step_valid
) -> list[LeafTally | None]:
    """One ``LeafTally`` per tree row (None for padding). exact: bool [B, b1..b4]."""
    consistent = leaf_consistency(texts[1], actions)
    out: list[LeafTally | None] = []
    for row, step in enumerate(steps):
        if not bool(np.asarray(step_valid)[row]):
            out.append(None)
            continue
        thoughts = texts[1][row].reshape(-1)
        out.append(
            LeafTally(
                leaves=int(actions[row].size),
                exact=int(np.asarray(exact[row], bool).sum()),
                consistent=int(consistent[row].sum()),
                thoughts=int(thoughts.size),
                naming_golden=sum(thought_names_action(str(t), step.action) for t in thoughts),
            )
        )
    return out


def _same_text(a: str, b: str) -> bool:
    return " ".join(str(a).lower().split()) == " ".join(str(b).lower().split())


def golden_ids(tokenizer, steps: Sequence[Step]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Golden s3 and s4 + ``<|im_end|>`` as right-padded ids: (action ids [B, Ta], lengths [B], grounding ids
    [B, Tg], lengths [B]); non-click goldens get just ``<|im_end|>``."""
    acts, grounds = [], []
    for s in steps:
        acts.append(tokenizer.encode(format_action(s.action) + IM_END))
        box = s.action.box
        if needs_grounding(s.action) and box is None and s.action.point is not None:
            x, y = s.action.point
            box = (x, y, x, y)
        grounds.append(tokenizer.encode((format_grounding(box) if needs_grounding(s.action) and box else "") + IM_END))

    def pad(seqs):
        width = max(len(q) for q in seqs)
        ids = np.full((len(seqs), width), tokenizer.ids.pad, np.int32)
        for i, q in enumerate(seqs):
            ids[i, : len(q)] = q
        return ids, np.array([len(q) for q in seqs], np.int32)

    a_ids, a_len = pad(acts)
    g_ids, g_len = pad(grounds)
    return a_ids, a_len, g_ids, g_len


def sampled_trees(batch, tokenizer):
    """A tree batch as the round loop's ``ipl.SampledTrees``."""
    a_ids, a_len, g_ids, g_len = golden_ids(tokenizer, batch.steps)
    return SampledTrees(
        tree=batch.tree,
        steps=batch.prompts,
        golden_action_ids=a_ids,
        golden_action_lengths=a_len,
        golden_grounding_ids=g_ids,
        golden_grounding_lengths=g_len,
    )
