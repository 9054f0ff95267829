"""Token ids of preference pairs (``gather_pair_tokens``) and of the naive-DPO baseline's whole-trajectory pairs
(``naive_dpo_pairs``, ``gather_naive_dpo_tokens``). Pure ``jnp``, jitted, fixed shapes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.coat import tree as tree_lib
from ipl_jax.preference.pairs import BETA, PairBatch, classify_trees, is_one

# ------------------------------------------------------------------------------------------------- tokens


@struct.dataclass
class PairTokens:
    """Token ids of each pair's continuations and prefix turns (P pairs, Tc tokens): ``batch_row``, ``step_index``,
    ``turn``, ``valid`` [P]; ``prefix_path`` int32[P, 3]; ``prefix_tokens`` 3 x int32[P, T_l], ``prefix_lengths``
    int32[P, 3]; ``positive_*`` / ``negative_*`` tokens int32[P, Tc], lengths int32[P], logps f32[P, Tc] (sampler's,
    0 for goldens); ``same_text`` bool[P] (no preference signal).
    """

    batch_row: jax.Array
    step_index: jax.Array
    turn: jax.Array
    valid: jax.Array
    prefix_path: jax.Array
    prefix_tokens: tuple[jax.Array, jax.Array, jax.Array]
    prefix_lengths: jax.Array
    positive_tokens: jax.Array
    positive_lengths: jax.Array
    positive_logps: jax.Array
    negative_tokens: jax.Array
    negative_lengths: jax.Array
    negative_logps: jax.Array
    same_text: jax.Array


def _pad_last(x, width, fill):
    extra = width - x.shape[-1]
    if extra == 0:
        return x
    return jnp.concatenate([x, jnp.full(x.shape[:-1] + (extra,), fill, x.dtype)], axis=-1)


def _check_goldens(B: int, golden_action_ids, golden_grounding_ids, golden_action_lengths, golden_grounding_lengths):
    """One-line error unless the golden ids are [B, T] and their lengths [B]."""
    for name, x, ndim in (
        ("golden_action_ids", golden_action_ids, 2),
        ("golden_grounding_ids", golden_grounding_ids, 2),
        ("golden_action_lengths", golden_action_lengths, 1),
        ("golden_grounding_lengths", golden_grounding_lengths, 1),
    ):
        if x.ndim != ndim or x.shape[0] != B:
            raise ValueError(f"gather_pair_tokens: {name} has shape {tuple(x.shape)}, expected [{B}, ...] ({ndim}-d)")


def _continuations(tree, pairs: PairBatch, goldens, width: int, pad_id: int):
    """Each pair's positive and negative continuation at its turn: sampled nodes from the tree, golden positives
    from ``goldens`` = ((action ids [B, Tg3], lengths [B]), (grounding ids [B, Tg4], lengths [B])).

    Returns (positive, negative), each (tokens int32[P, width], logps f32[P, width], lengths int32[P]); pairs at
    no turn (invalid) keep pad_id / 0.
    """
    row, turn, valid = pairs.batch_row, pairs.turn, pairs.valid
    pos_tok = jnp.full((pairs.capacity, width), pad_id, jnp.int32)
    neg_tok = pos_tok
    pos_lp = jnp.zeros((pairs.capacity, width), jnp.float32)
    neg_lp = pos_lp
    pos_len = jnp.zeros((pairs.capacity,), jnp.int32)
    neg_len = pos_len
    for level in range(1, tree_lib.NUM_TURNS + 1):
        toks = _pad_last(tree.level_flat("tokens", level).astype(jnp.int32), width, pad_id)
        lps = _pad_last(tree.level_flat("logps", level).astype(jnp.float32), width, 0.0)
        lens = tree.level_flat("lengths", level).astype(jnp.int32)
        n = lens.shape[1]
        here = valid & (turn == level)
        pos_here = here & ~pairs.positive_golden
        p_node = jnp.clip(pairs.positive_node, 0, n - 1)
        n_node = jnp.clip(pairs.negative_node, 0, n - 1)
        pos_tok = jnp.where(pos_here[:, None], toks[row, p_node], pos_tok)
        pos_lp = jnp.where(pos_here[:, None], lps[row, p_node], pos_lp)
        pos_len = jnp.where(pos_here, lens[row, p_node], pos_len)
        neg_tok = jnp.where(here[:, None], toks[row, n_node], neg_tok)
        neg_lp = jnp.where(here[:, None], lps[row, n_node], neg_lp)
        neg_len = jnp.where(here, lens[row, n_node], neg_len)
    for level, (ids, lens) in zip((tree_lib.ACTION_TURN, tree_lib.GROUNDING_TURN), goldens):
        here = valid & pairs.positive_golden & (turn == level)
        padded = _pad_last(ids.astype(jnp.int32), width, pad_id)
        pos_tok = jnp.where(here[:, None], padded[row], pos_tok)
        pos_len = jnp.where(here, lens.astype(jnp.int32)[row], pos_len)
    return (pos_tok, pos_lp, pos_len), (neg_tok, neg_lp, neg_len)


def _prefixes(tree, pairs: PairBatch, pad_id: int):
    """Each pair's prefix turns: the ancestor at level l < t of its level-(t-1) prefix node.

    Returns (path int32[P, 3] with -1 past the prefix, tokens 3 x int32[P, T_l], lengths int32[P, 3]).
    """
    row, turn, valid = pairs.batch_row, pairs.turn, pairs.valid
    depth = tree_lib.NUM_TURNS
    divisor = np.ones((depth + 1, depth - 1), np.int32)  # [turn, level-1]
    for t in range(1, depth + 1):
        for lvl in range(1, depth):
            if lvl < t:
                divisor[t, lvl - 1] = int(np.prod(tree.branching[lvl : t - 1]))
    div = jnp.asarray(divisor)[turn]  # [P, 3]
    levels = jnp.arange(1, depth, dtype=jnp.int32)
    in_prefix = valid[:, None] & (levels[None, :] < turn[:, None])
    path = jnp.where(in_prefix, pairs.prefix_node[:, None] // div, -1)
    prefix_tokens, prefix_lengths = [], []
    for lvl in range(1, depth):
        toks = tree.level_flat("tokens", lvl).astype(jnp.int32)
        lens = tree.level_flat("lengths", lvl).astype(jnp.int32)
        node = jnp.clip(path[:, lvl - 1], 0, lens.shape[1] - 1)
        use = in_prefix[:, lvl - 1]
        prefix_tokens.append(jnp.where(use[:, None], toks[row, node], pad_id))
        prefix_lengths.append(jnp.where(use, lens[row, node], 0))
    return path.astype(jnp.int32), tuple(prefix_tokens), jnp.stack(prefix_lengths, axis=1)


@functools.partial(jax.jit, static_argnames=("pad_id",))
def gather_pair_tokens(
    tree: tree_lib.CoaTTree,
    pairs: PairBatch,
    golden_action_ids: jax.Array,
    golden_grounding_ids: jax.Array,
    golden_action_lengths: jax.Array,
    golden_grounding_lengths: jax.Array,
    pad_id: int = 0,
) -> PairTokens:
    """Continuation and prefix token ids of every pair (invalid pairs: padding). Golden ids: action int32[B, Tg3],
    grounding int32[B, Tg4], with lengths int32[B].
    """
    _check_goldens(
        tree.batch_size, golden_action_ids, golden_grounding_ids, golden_action_lengths, golden_grounding_lengths
    )
    width = max(tree.turn_lengths + (golden_action_ids.shape[1], golden_grounding_ids.shape[1]))
    goldens = ((golden_action_ids, golden_action_lengths), (golden_grounding_ids, golden_grounding_lengths))
    (pos_tok, pos_lp, pos_len), (neg_tok, neg_lp, neg_len) = _continuations(tree, pairs, goldens, width, pad_id)
    path, prefix_tokens, prefix_lengths = _prefixes(tree, pairs, pad_id)
    valid = pairs.valid
    return PairTokens(
        batch_row=pairs.batch_row,
        step_index=pairs.step_index,
        turn=pairs.turn,
        valid=valid,
        prefix_path=path,
        prefix_tokens=prefix_tokens,
        prefix_lengths=prefix_lengths,
        positive_tokens=jnp.where(valid[:, None], pos_tok, pad_id),
        positive_lengths=jnp.where(valid, pos_len, 0),
        positive_logps=jnp.where(valid[:, None], pos_lp, 0.0),
        negative_tokens=jnp.where(valid[:, None], neg_tok, pad_id),
        negative_lengths=jnp.where(valid, neg_len, 0),
        negative_logps=jnp.where(valid[:, None], neg_lp, 0.0),
        same_text=valid
        & (pos_len == neg_len)
        & jnp.all((pos_tok == neg_tok) | (jnp.arange(width)[None, :] >= pos_len[:, None]), axis=1),
    )


# ------------------------------------------------------------------------------------------------- naive DPO


@struct.dataclass
class NaiveDPOPairs:
    """One whole-CoaT pair per tree (naive-DPO baseline): ``chosen_leaf`` / ``rejected_leaf`` int32[B] flat leaf
    indices; ``valid`` bool[B] (β trees only).
    """

    chosen_leaf: jax.Array
    rejected_leaf: jax.Array
    valid: jax.Array


@functools.partial(jax.jit, static_argnames=("one_tolerance",))
def naive_dpo_pairs(leaf_values: jax.Array, step_valid: jax.Array, one_tolerance: float = 1e-6) -> NaiveDPOPairs:
    """Chosen = the first value-1 leaf; rejected = the lowest-valued leaf (first among ties).
    leaf_values: f32[B, b1, b2, b3, b4]; step_valid: bool[B].
    """
    B = leaf_values.shape[0]
    flat = leaf_values.reshape(B, -1).astype(jnp.float32)
    ones = is_one(flat, one_tolerance)
    chosen = jnp.argmax(ones, axis=1).astype(jnp.int32)
    rejected = jnp.argmin(jnp.where(ones, jnp.inf, flat), axis=1).astype(jnp.int32)
    valid = classify_trees(leaf_values, step_valid, one_tolerance) == BETA
    return NaiveDPOPairs(
        chosen_leaf=jnp.where(valid, chosen, 0),
        rejected_leaf=jnp.where(valid, rejected, 0),
        valid=valid,
    )


@functools.partial(jax.jit, static_argnames=("pad_id",))
def gather_naive_dpo_tokens(tree: tree_lib.CoaTTree, pairs: NaiveDPOPairs, pad_id: int = 0) -> dict:
    """The four turn texts of each chosen / rejected leaf path: ``{"chosen_tokens": 4 x int32[B, T_l],
    "chosen_lengths": int32[B, 4], "rejected_tokens", "rejected_lengths", "valid": bool[B]}``.
    """
    paths = jnp.asarray(tree_lib.leaf_paths(tree.branching))  # [L, 4]
    rows = jnp.arange(tree.batch_size)
    out = {"valid": pairs.valid}
    for name, leaf in (("chosen", pairs.chosen_leaf), ("rejected", pairs.rejected_leaf)):
        toks, lens = [], []
        for level in range(1, tree_lib.NUM_TURNS + 1):
            node = paths[leaf, level - 1]
            t = tree.level_flat("tokens", level)[rows, node].astype(jnp.int32)
            n = tree.level_flat("lengths", level)[rows, node].astype(jnp.int32)
            toks.append(jnp.where(pairs.valid[:, None], t, pad_id))
            lens.append(jnp.where(pairs.valid, n, 0))
        out[f"{name}_tokens"] = tuple(toks)
        out[f"{name}_lengths"] = jnp.stack(lens, axis=1)
    return out
