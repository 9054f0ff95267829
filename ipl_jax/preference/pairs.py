"""Tree classes (α / β / γ) and thinking-level preference pairs from scored CoaT-trees (docs/method.md §6), in
pure ``jnp`` with fixed shapes (``extract_pairs`` never recompiles for new data).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.coat import tree as tree_lib
from ipl_jax.coat.actions import ACTION_TYPES, Action

ALPHA, BETA, GAMMA = 0, 1, 2
NO_TREE = -1  # class of a padding row
CLASS_NAMES = ("alpha", "beta", "gamma")
INVALID_TYPE = -1
CLICK_LIKE_TYPES = (ACTION_TYPES.index("click"), ACTION_TYPES.index("long_press"))


@dataclasses.dataclass(frozen=True)
class PairConfig:
    """Pair-extraction settings (defaults are our choices; the paper gives none).

    "= 1" means ``v >= 1 - one_tolerance``; a β pair needs a gap > 1/K + ``gap_tolerance``. β pairs come from β
    trees, γ pairs (golden s3 / s4 vs sampled) from γ trees; a sampled s3 of the golden's click type is a γ
    negative only if its text differs. Positives and negatives are ranked round-robin, by gap, then index.
    """

    max_beta_pairs_per_tree_turn: int = 9
    max_gamma_pairs_per_tree_turn: int = 9
    one_tolerance: float = 1e-6  # v >= 1 - one_tolerance counts as "= 1"
    gap_tolerance: float = 1e-6  # a β pair needs gap > 1/K + gap_tolerance
    gamma_action_pairs: bool = True  # γ pairs at the action turn s3
    gamma_grounding_pairs: bool = True  # γ pairs at the grounding turn s4 (click-like goldens)
    turns: tuple = (1, 2, 3, 4)  # CoaT turns that give pairs (e.g. (3, 4): action and grounding only)

    def __post_init__(self):
        if not self.turns or not set(self.turns) <= {1, 2, 3, 4}:
            raise ValueError(f"PairConfig.turns must be a non-empty subset of (1, 2, 3, 4), got {self.turns}")
        if self.max_beta_pairs_per_tree_turn < 0 or self.max_gamma_pairs_per_tree_turn < 0:
            raise ValueError("PairConfig: pair caps must be >= 0")
        if not 0 <= self.one_tolerance < 0.5 or not 0 <= self.gap_tolerance < 0.1:
            raise ValueError("PairConfig: tolerances out of range")


def action_type_id(action: Action | str | None) -> int:
    """The integer type code used by ``leaf_types`` / ``golden_types``: index into ACTION_TYPES, -1 if invalid."""
    if action is None:
        return INVALID_TYPE
    if isinstance(action, Action):
        if not action.parsed:
            return INVALID_TYPE
        action = action.type
    return ACTION_TYPES.index(action) if action in ACTION_TYPES else INVALID_TYPE


# ------------------------------------------------------------------------------------------------- classes


def is_one(values: jax.Array, one_tolerance: float = 1e-6) -> jax.Array:
    """values == 1 up to tolerance: ``values >= 1 - one_tolerance``. Same shape, bool."""
    return values >= 1.0 - one_tolerance


def classify_trees(
    leaf_values: jax.Array, step_valid: jax.Array | None = None, one_tolerance: float = 1e-6
) -> jax.Array:
    """Class of each tree: ALPHA (every leaf = 1), BETA (some = 1, some ≠ 1), GAMMA (none = 1), NO_TREE (padding).

    leaf_values: f32[B, b1, ..., bD]; step_valid: bool[B] or None (all valid). Returns int32[B].
    """
    ones = is_one(leaf_values, one_tolerance).reshape(leaf_values.shape[0], -1)
    n_one = jnp.sum(ones, axis=1)
    n = ones.shape[1]
    cls = jnp.where(n_one == n, ALPHA, jnp.where(n_one > 0, BETA, GAMMA)).astype(jnp.int32)
    if step_valid is not None:
        cls = jnp.where(step_valid, cls, NO_TREE)
    return cls


def tree_class_counts(classes: jax.Array) -> jax.Array:
    """Number of α, β, γ trees (padding excluded): int32[B] -> int32[3]."""
    return jnp.stack([jnp.sum(classes == c) for c in (ALPHA, BETA, GAMMA)]).astype(jnp.int32)


def tree_class_shares(counts) -> dict:
    """Shares of a round from class counts int[3]: ``alpha``, ``beta``, ``gamma``, ``potential_correct`` (α + β),
    ``valid_sampling`` (β + γ), ``correct_sample`` (= α + β), ``trees``. All 0 without trees.
    """
    a, b, g = (float(x) for x in np.asarray(counts))
    n = a + b + g
    share = (lambda x: x / n) if n > 0 else (lambda x: 0.0)
    return {
        "alpha": share(a),
        "beta": share(b),
        "gamma": share(g),
        "potential_correct": share(a + b),
        "valid_sampling": share(b + g),
        "correct_sample": share(a + b),
        "trees": int(n),
    }


# ------------------------------------------------------------------------------------------------- pairs


@struct.dataclass
class PairBatch:
    """Preference pairs of one tree batch, padded to ``P`` (real iff ``valid``), each comparing two turn-t
    continuations after row ``batch_row``'s prefix. Node indices are flat per level (``positive_node`` -1 when
    golden); values f32[P] (golden = 1); ``count`` / ``count_by_turn`` / ``count_by_class`` / ``dropped``.
    """

    batch_row: jax.Array
    step_index: jax.Array
    turn: jax.Array
    prefix_node: jax.Array
    positive_node: jax.Array
    positive_golden: jax.Array
    negative_node: jax.Array
    positive_value: jax.Array
    negative_value: jax.Array
    value_gap: jax.Array
    positive_type: jax.Array
    tree_class: jax.Array
    valid: jax.Array
    count: jax.Array
    count_by_turn: jax.Array
    count_by_class: jax.Array
    dropped: jax.Array

    @property
    def capacity(self) -> int:
        return int(self.valid.shape[0])


def _rank_and_take(mask, tier, group, gap, cap: int):
    """The first ``cap`` candidates per row (valid, tier, round-robin by (tier, group), gap, index)."""
    R, N = mask.shape
    gap = jnp.where(mask, gap, 0.0)
    # rank within (tier, group): valid candidates of the same key that come first by (larger gap, lower index)
    idx = jnp.arange(N)
    before = (gap[:, None, :] > gap[:, :, None]) | (
        (gap[:, None, :] == gap[:, :, None]) & (idx[None, :] < idx[:, None])[None]
    )
    same = (group[:, None, :] == group[:, :, None]) & (tier[:, None, :] == tier[:, :, None]) & mask[:, None, :]
    rank = jnp.sum(same & before, axis=2).astype(jnp.int32)  # [R, N]
    # one integer key (valid first, higher tier, lower rank); the stable sort keeps index order among equals
    order_key = jnp.where(mask, (1 - tier) * (N + 1) + rank, 2 * (N + 1))
    final = jnp.lexsort((-gap, order_key), axis=-1)
    take = min(cap, N)
    chosen = final[:, :take].astype(jnp.int32)
    taken = jnp.take_along_axis(mask, chosen, axis=1)
    if take < cap:
        chosen = jnp.pad(chosen, ((0, 0), (0, cap - take)))
        taken = jnp.pad(taken, ((0, 0), (0, cap - take)))
    return chosen, taken


def _check_inputs(node_values, leaf_types, golden_types, step_valid):
    if len(node_values) != tree_lib.NUM_TURNS:
        raise ValueError(f"node_values: expected {tree_lib.NUM_TURNS} levels, got {len(node_values)}")
    leaf_values = node_values[-1]
    B = leaf_values.shape[0]
    branching = tree_lib.check_branching(leaf_values.shape[1:])
    for t, v in enumerate(node_values, start=1):
        if tuple(v.shape) != (B,) + branching[:t]:
            raise ValueError(f"node_values[level {t}]: shape {tuple(v.shape)}, expected {(B,) + branching[:t]}")
    if tuple(leaf_types.shape) != tuple(leaf_values.shape):
        raise ValueError(f"leaf_types: shape {tuple(leaf_types.shape)}, expected {tuple(leaf_values.shape)}")
    if tuple(golden_types.shape) != (B,):
        raise ValueError(f"golden_types: shape {tuple(golden_types.shape)}, expected ({B},)")
    if tuple(step_valid.shape) != (B,):
        raise ValueError(f"step_valid: shape {tuple(step_valid.shape)}, expected ({B},)")
    return B, branching


def _beta_block(node_values, leaf_types, classes, branching, turn, config):
    """Candidates of β pairs at ``turn``: every ordered sibling pair (k ↑, k' ↓). Fields f32/int32/bool[B, N]."""
    B = classes.shape[0]
    K = branching[turn - 1]
    n_par = tree_lib.num_nodes(branching, turn - 1)
    leaf_values = node_values[-1]
    v = node_values[turn - 1].reshape(B, n_par, K)
    gap = v[:, :, :, None] - v[:, :, None, :]  # [B, parent, k (pos), k' (neg)]
    mask = (gap > 1.0 / K + config.gap_tolerance) & (classes == BETA)[:, None, None, None]
    below_v = tree_lib.leaves_below(leaf_values, branching, turn)  # [B, n_t, leaves per node]
    below_t = tree_lib.leaves_below(leaf_types, branching, turn)
    leads_to_one = jnp.any(is_one(below_v, config.one_tolerance), axis=-1).reshape(B, n_par, K)
    best = jnp.argmax(below_v, axis=-1)[..., None]  # the positive's type: that of its best leaf (first on ties)
    pos_type = jnp.take_along_axis(below_t, best, axis=-1)[..., 0].reshape(B, n_par, K)
    shape = (B, n_par, K, K)
    parent = jnp.arange(n_par, dtype=jnp.int32)[None, :, None, None]
    pos = jnp.broadcast_to(parent * K + jnp.arange(K, dtype=jnp.int32)[None, None, :, None], shape)
    neg = jnp.broadcast_to(parent * K + jnp.arange(K, dtype=jnp.int32)[None, None, None, :], shape)
    flat = lambda x: jnp.broadcast_to(x, shape).reshape(B, -1)
    return dict(
        mask=flat(mask),
        tier=flat(leads_to_one[..., None].astype(jnp.int32)),
        group=flat(pos_type[..., None]),
        gap=flat(gap),
        prefix=flat(parent),
        pos=flat(pos),
        neg=flat(neg),
        golden=flat(False),
        pos_v=flat(v[:, :, :, None]),
        neg_v=flat(v[:, :, None, :]),
        ptype=flat(pos_type[..., None]),
    )


def _gamma_block(node_values, classes, golden_types, branching, turn, eligible, config):
    """Candidates of γ pairs at ``turn`` (3 or 4): golden ↑ vs each eligible sampled node ↓. Fields [B, n_turn]."""
    B = classes.shape[0]
    n = tree_lib.num_nodes(branching, turn)
    v = node_values[turn - 1].reshape(B, n)
    node = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (B, n))
    mask = (classes == GAMMA)[:, None] & eligible & ~is_one(v, config.one_tolerance)
    return dict(
        mask=mask,
        tier=jnp.zeros((B, n), jnp.int32),
        group=tree_lib.ancestor_index(node, branching, turn, 2),  # spread over the level-2 prefix (thought)
        gap=1.0 - v,
        prefix=tree_lib.parent_index(node, branching, turn),
        pos=jnp.full((B, n), -1, jnp.int32),
        neg=node,
        golden=jnp.ones((B, n), bool),
        pos_v=jnp.ones((B, n), jnp.float32),
        neg_v=v,
        ptype=jnp.broadcast_to(golden_types[:, None], (B, n)),
    )


def _gamma_eligibility(leaf_types, golden_types, branching, action_text_matches_golden, thought_allows_gamma=None):
    """Which sampled s3 (bool[B, n3]) and s4 (bool[B, n4]) may be γ negatives; ``thought_allows_gamma`` (bool[B,
    b1, b2] or None) restricts action-turn negatives to s3 below the marked thoughts."""
    B = golden_types.shape[0]
    n3 = tree_lib.num_nodes(branching, 3)
    golden_click = jnp.isin(golden_types, jnp.asarray(CLICK_LIKE_TYPES))[:, None]  # [B, 1]
    s3_type = tree_lib.leaves_below(leaf_types, branching, 3)[..., 0]  # [B, n3]: leaves below an s3 share it
    same_click = (s3_type == golden_types[:, None]) & golden_click
    if action_text_matches_golden is not None:
        if tuple(action_text_matches_golden.shape) != (B,) + branching[:3]:
            raise ValueError(
                f"action_text_matches_golden: shape {tuple(action_text_matches_golden.shape)}, "
                f"expected {(B,) + branching[:3]}"
            )
        same_click = same_click & action_text_matches_golden.reshape(B, n3).astype(bool)
    action_ok = ~same_click
    if thought_allows_gamma is not None:
        if tuple(thought_allows_gamma.shape) != (B,) + branching[:2]:
            raise ValueError(
                f"thought_allows_gamma: shape {tuple(thought_allows_gamma.shape)}, expected {(B,) + branching[:2]}"
            )
        allowed = jnp.repeat(thought_allows_gamma.reshape(B, -1).astype(bool), branching[2], axis=1)
        action_ok = action_ok & allowed
    return action_ok, jnp.repeat(same_click, branching[3], axis=1)


def _pad_candidates(fields, width):
    extra = width - fields["mask"].shape[1]
    if extra == 0:
        return fields
    return {k: jnp.pad(x, ((0, 0), (0, extra))) for k, x in fields.items()}  # padding: mask False


def _candidate_blocks(node_values, leaf_types, golden_types, classes, branching, eligible, config):
    """The candidate blocks in output order: a list of (turn, tree class, cap, fields [B, N]) — β pairs of every
    branching turn, then the γ pairs of the action / grounding turn. ``eligible`` = (action_ok, grounding_ok).
    """
    action_ok, grounding_ok = eligible
    beta_cap, gamma_cap = config.max_beta_pairs_per_tree_turn, config.max_gamma_pairs_per_tree_turn
    gamma_turns = {}
    if config.gamma_action_pairs:
        gamma_turns[tree_lib.ACTION_TURN] = action_ok
    if config.gamma_grounding_pairs:
        gamma_turns[tree_lib.GROUNDING_TURN] = grounding_ok
    blocks = []
    for t in range(1, tree_lib.NUM_TURNS + 1):
        if t not in config.turns:
            continue
        if branching[t - 1] > 1 and beta_cap > 0:
            blocks.append((t, BETA, beta_cap, _beta_block(node_values, leaf_types, classes, branching, t, config)))
        if gamma_cap > 0 and t in gamma_turns:
            fields = _gamma_block(node_values, classes, golden_types, branching, t, gamma_turns[t], config)
            blocks.append((t, GAMMA, gamma_cap, fields))
    if not blocks:
        raise ValueError("extract_pairs: the config and branching allow no pairs at all")
    return blocks


def _rank_blocks(blocks, B: int):
    """Rank every (tree, block) in one batched call, candidates padded to a common width.

    Returns the slots in (row, block, rank) order, each flat [B * nb * slot_cap]: the picked candidate fields
    (dict, ``mask`` left out), turn int32, tree class int32, batch row int32, valid bool.
    """
    width = max(f["mask"].shape[1] for *_, f in blocks)
    nb = len(blocks)
    padded = [_pad_candidates(f, width) for *_, f in blocks]
    stacked = {k: jnp.stack([f[k] for f in padded], axis=1).reshape(B * nb, width) for k in padded[0]}
    slot_cap = max(min(cap, width) for _, _, cap, _ in blocks)
    chosen, taken = _rank_and_take(stacked["mask"], stacked["tier"], stacked["group"], stacked["gap"], slot_cap)
    block_cap = jnp.asarray([cap for _, _, cap, _ in blocks], jnp.int32)
    taken = taken.reshape(B, nb, slot_cap) & (jnp.arange(slot_cap)[None, None, :] < block_cap[None, :, None])
    pick = {k: jnp.take_along_axis(x, chosen, axis=1).reshape(-1) for k, x in stacked.items() if k != "mask"}
    per_block = lambda values: jnp.broadcast_to(
        jnp.asarray(values, jnp.int32)[None, :, None], (B, nb, slot_cap)
    ).reshape(-1)
    turn_all = per_block([t for t, *_ in blocks])
    class_all = per_block([c for _, c, *_ in blocks])
    rows = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None, None], (B, nb, slot_cap)).reshape(-1)
    return pick, turn_all, class_all, rows, taken.reshape(-1)


def _compact_pairs(pick, turn_all, class_all, rows, valid, step_index, capacity: int) -> PairBatch:
    """Move the valid slots (flat, in order) to the front of a capacity-P buffer; the rest count as dropped.
    step_index: int32[B]. Returns the PairBatch.
    """
    position = jnp.cumsum(valid.astype(jnp.int32)) - 1
    total = jnp.sum(valid.astype(jnp.int32))
    target = jnp.where(valid & (position < capacity), position, capacity)  # index `capacity` is dropped

    def compact(values, fill):
        return jnp.full((capacity,), fill, values.dtype).at[target].set(values, mode="drop")

    turn = compact(turn_all, 0)
    tree_class = compact(class_all, NO_TREE)
    kept = compact(valid, False)
    batch_row = compact(rows, 0)
    pos_v = compact(pick["pos_v"], 0.0)
    neg_v = compact(pick["neg_v"], 0.0)
    count = jnp.minimum(total, capacity).astype(jnp.int32)
    return PairBatch(
        batch_row=batch_row,
        step_index=jnp.where(kept, step_index[batch_row], 0),
        turn=turn,
        prefix_node=compact(pick["prefix"], 0),
        positive_node=compact(pick["pos"], -1),
        positive_golden=compact(pick["golden"], False),
        negative_node=compact(pick["neg"], 0),
        positive_value=pos_v,
        negative_value=neg_v,
        value_gap=pos_v - neg_v,
        positive_type=compact(pick["ptype"], INVALID_TYPE),
        tree_class=tree_class,
        valid=kept,
        count=count,
        count_by_turn=jnp.stack([jnp.sum(kept & (turn == t)) for t in range(1, 5)]).astype(jnp.int32),
        count_by_class=jnp.stack([jnp.sum(kept & (tree_class == c)) for c in (ALPHA, BETA, GAMMA)]).astype(jnp.int32),
        dropped=(total - count).astype(jnp.int32),
    )


@functools.partial(jax.jit, static_argnames=("config", "capacity"))
def extract_pairs(
    node_values: Sequence[jax.Array],
    leaf_types: jax.Array,
    golden_types: jax.Array,
    step_valid: jax.Array,
    *,
    step_index: jax.Array | None = None,
    action_text_matches_golden: jax.Array | None = None,
    thought_allows_gamma: jax.Array | None = None,
    config: PairConfig = PairConfig(),
    capacity: int | None = None,
) -> PairBatch:
    """β and γ pairs of a batch of scored CoaT-trees, padded to a static ``capacity`` (default: the most possible).
    Inputs as the module says, plus optional action_text_matches_golden bool[B, b1, b2, b3] and
    thought_allows_gamma bool[B, b1, b2]. Valid pairs first, by row, turn (β before γ), rank.
    """
    B, branching = _check_inputs(node_values, leaf_types, golden_types, step_valid)
    node_values = tuple(jnp.asarray(v, jnp.float32) for v in node_values)
    leaf_types = jnp.asarray(leaf_types, jnp.int32)
    golden_types = jnp.asarray(golden_types, jnp.int32)
    step_valid = jnp.asarray(step_valid, bool)
    classes = classify_trees(node_values[-1], step_valid, config.one_tolerance)
    step_index = jnp.arange(B, dtype=jnp.int32) if step_index is None else jnp.asarray(step_index, jnp.int32)
    eligible = _gamma_eligibility(
        leaf_types,
        golden_types,
        branching,
        action_text_matches_golden,
        None if thought_allows_gamma is None else jnp.asarray(thought_allows_gamma, bool),
    )
    blocks = _candidate_blocks(node_values, leaf_types, golden_types, classes, branching, eligible, config)
    if capacity is None:
        capacity = B * sum(min(cap, f["mask"].shape[1]) for _, _, cap, f in blocks)
    capacity = int(capacity)
    if capacity < 1:
        raise ValueError(f"extract_pairs: capacity must be >= 1, got {capacity}")
    return _compact_pairs(*_rank_blocks(blocks, B), step_index, capacity)
