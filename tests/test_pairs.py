"""Tree classes, β / γ preference pairs, pair tokens and naive-DPO pairs: known answers on hand-made trees and
agreement with a direct Python enumeration of docs/method.md §6 on random trees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.compiles import count_traces
from support.trees import assert_trees_close

from ipl_jax.coat import tree as T
from ipl_jax.preference import pair_tokens as PT
from ipl_jax.preference import pairs as P

B3 = (3, 3, 3, 1)
CLICK, LONG, TYPE, SCROLL, PRESS = (P.action_type_id(t) for t in ("click", "long_press", "type", "scroll", "press"))
INVALID = P.INVALID_TYPE
BIG = P.PairConfig(max_beta_pairs_per_tree_turn=1000, max_gamma_pairs_per_tree_turn=1000)
SMALL = P.PairConfig(max_beta_pairs_per_tree_turn=2, max_gamma_pairs_per_tree_turn=3)


def backup(leaf, c=1.0):
    """Node values per level by direct reshape + mean (docs/method.md §5), leaves first. leaf: [B, b1, b2, b3, b4]."""
    vals = [np.asarray(leaf, np.float32)]
    for _ in range(3):
        vals.insert(0, (np.float32(c) * vals[0].mean(axis=-1)).astype(np.float32))
    return tuple(vals)


ROWS = 8  # every call pads its batch to 8 rows, so the tests share a handful of compilations


def extract(node_values, leaf_types, golden, valid=None, text=None, **kw):
    """extract_pairs on a batch padded to ROWS rows (padding rows invalid); returns numpy fields.

    ``text`` (action_text_matches_golden) defaults to all-True, which means the same as leaving it out."""
    B = node_values[-1].shape[0]
    branching = node_values[-1].shape[1:]
    valid = np.ones(B, bool) if valid is None else np.asarray(valid, bool)
    text = np.ones((B,) + branching[:3], bool) if text is None else text
    pad = lambda x: np.concatenate([np.asarray(x), np.zeros((ROWS - B,) + np.shape(x)[1:], np.asarray(x).dtype)])
    pb = P.extract_pairs(
        tuple(jnp.asarray(pad(v), jnp.float32) for v in node_values),
        jnp.asarray(pad(leaf_types), jnp.int32),
        jnp.asarray(pad(golden), jnp.int32),
        jnp.asarray(pad(valid)),
        step_index=jnp.arange(ROWS, dtype=jnp.int32),
        action_text_matches_golden=jnp.asarray(pad(text)),
        **kw,
    )
    return jax.tree_util.tree_map(np.asarray, pb)


def pair_list(pb, row=None, turn=None):
    """Valid pairs as (row, turn, prefix, positive (-1 golden), negative), in output order."""
    out = []
    cols = [np.asarray(x) for x in (pb.batch_row, pb.turn, pb.prefix_node, pb.positive_node, pb.negative_node)]
    valid = np.asarray(pb.valid)
    for i in range(pb.capacity):
        if not valid[i]:
            continue
        item = tuple(int(c[i]) for c in cols)
        if (row is None or item[0] == row) and (turn is None or item[1] == turn):
            out.append(item)
    return out


# ------------------------------------------------------------------------------------------------- classes


def test_action_type_ids():
    from ipl_jax.coat.actions import Action, parse_action_text

    assert P.action_type_id("click") == 0 and P.action_type_id(Action(type="scroll", direction="up")) == SCROLL
    assert P.action_type_id(parse_action_text("gibberish")) == INVALID
    assert P.action_type_id(None) == INVALID and P.action_type_id("fly") == INVALID


def test_classify_alpha_beta_gamma_and_tolerance():
    leaf = np.zeros((6,) + B3, np.float32)
    leaf[0] = 1.0  # α
    leaf[1] = 0.5
    leaf[1, 2, 1, 0, 0] = 1.0  # β: one leaf = 1
    leaf[2] = 0.9  # γ
    leaf[3] = np.float32(1 - 1e-7)  # within tolerance of 1 -> α
    leaf[4] = np.float32(1 - 1e-5)  # outside -> γ
    leaf[5] = leaf[1]  # padding row
    valid = np.array([1, 1, 1, 1, 1, 0], bool)
    cls = np.asarray(P.classify_trees(jnp.asarray(leaf), jnp.asarray(valid)))
    np.testing.assert_array_equal(cls, [P.ALPHA, P.BETA, P.GAMMA, P.ALPHA, P.GAMMA, P.NO_TREE])
    counts = np.asarray(P.tree_class_counts(jnp.asarray(cls)))
    np.testing.assert_array_equal(counts, [2, 1, 2])
    s = P.tree_class_shares(counts + np.array([0, 1, -1]))  # 2 α, 2 β, 1 γ
    assert s == pytest.approx(
        {
            "alpha": 0.4,
            "beta": 0.4,
            "gamma": 0.2,
            "potential_correct": 0.8,
            "valid_sampling": 0.6,
            "correct_sample": 0.8,
            "trees": 5,
        }
    )
    assert P.tree_class_shares([0, 0, 0])["beta"] == 0.0


# ------------------------------------------------------------------------------------------------- β pairs


def _flat_beta_tree(B=4):
    """β trees (leaf 0 = 1, the rest 0) whose inner node values are all equal: no pairs unless a test sets some."""
    leaf = np.zeros((B,) + B3, np.float32)
    leaf[:, 0, 0, 0, 0] = 1.0
    vals = [np.full((B,) + B3[:t], 0.5, np.float32) for t in (1, 2, 3)] + [leaf]
    vals[2][:] = 0.5
    types = np.full((B,) + B3, CLICK, np.int32)
    return vals, types


def test_beta_gap_exactly_one_over_k_is_not_a_pair():
    vals, types = _flat_beta_tree()
    third = np.float32(1 / 3)
    vals[0][0] = [0.9, np.float32(0.9 - 1 / 3), np.float32(0.9 - 1 / 3 - 1e-4)]
    # a gap that is 1/3 on paper but lands one ulp above float32(1/3) after rounding
    a = 0.54
    assert np.float32(np.float32(a) - np.float32(a - 1 / 3)) > third
    vals[0][1] = [np.float32(a), np.float32(a - 1 / 3), np.float32(a)]
    # just above 1/K (by 1e-5, above the 1e-6 tolerance) at turn 2, row 2
    vals[1][2, 1] = [0.2, np.float32(0.2 + 1 / 3 + 1e-5), 0.2]
    pb = extract(vals, types, np.full(4, CLICK), config=BIG)
    assert pair_list(pb, turn=4) == [] and pair_list(pb, turn=3) == []
    assert pair_list(pb) == [(0, 1, 0, 0, 2), (2, 2, 1, 4, 3), (2, 2, 1, 4, 5)]
    np.testing.assert_allclose(np.asarray(pb.value_gap)[:3], [1 / 3 + 1e-4, 1 / 3 + 1e-5, 1 / 3 + 1e-5], atol=1e-6)


def test_beta_gap_one_half_with_k2():
    b = (2, 3, 2, 2)
    leaf = np.full((1,) + b, 0.5, np.float32)
    leaf[0, 0, 0, 0, :] = 1.0  # β tree; these two siblings tie
    leaf[0, 1, 2, 1, :] = [0.75, 0.25]  # exactly 1/2 at turn 4: not a pair
    leaf[0, 1, 2, 0, :] = [0.4999, 1.0]  # 0.5001: a pair (level-3 node 10, leaves 20 and 21)
    vals = [np.full((1,) + b[:t], 0.5, np.float32) for t in (1, 2, 3)] + [leaf]
    vals[0][0] = [0.75, 0.25]  # exactly 1/2 at turn 1: not a pair
    vals[2][0, 1, 0] = [0.2499, 0.75]  # 0.5001 at turn 3: level-2 node 3, children 6 and 7
    pb = extract(vals, np.zeros((1,) + b, np.int32), [CLICK], config=SMALL)
    assert pair_list(pb) == [(0, 3, 3, 7, 6), (0, 4, 10, 21, 20)]


def test_beta_prefers_positives_leading_to_value_one():
    leaf = np.zeros((1,) + B3, np.float32)
    leaf[0, 0, 0, :, 0] = [1.0, 0.2, 0.0]  # level-2 node A = 0: mean 0.4, holds a value-1 leaf
    leaf[0, 0, 1, :, 0] = 0.9  # node B = 1: mean 0.9, no value-1 leaf
    leaf[0, 0, 2, :, 0] = 0.0  # node C = 2: mean 0
    types = np.full((1,) + B3, CLICK, np.int32)
    vals = backup(leaf)
    # cap 2: A>C comes before B>C although its gap is smaller
    assert pair_list(extract(vals, types, [CLICK], config=SMALL), turn=2) == [(0, 2, 0, 0, 2), (0, 2, 0, 1, 2)]
    pb = extract(vals, types, [CLICK], config=BIG)
    assert pair_list(pb, turn=2) == [(0, 2, 0, 0, 2), (0, 2, 0, 1, 2), (0, 2, 0, 1, 0)]
    assert pair_list(pb, turn=3) == [(0, 3, 0, 0, 2), (0, 3, 0, 0, 1)]  # 0.2 vs 0: gap below 1/3
    assert pair_list(pb, turn=1) == [(0, 1, 0, 0, 1), (0, 1, 0, 0, 2)]
    i = pair_list(pb).index((0, 2, 0, 1, 0))
    assert float(pb.positive_value[i]) == pytest.approx(0.9) and float(pb.value_gap[i]) == pytest.approx(0.5)


def test_beta_spreads_positives_over_action_types():
    leaf = np.zeros((1,) + B3, np.float32)
    types = np.full((1,) + B3, PRESS, np.int32)
    for node in range(3):  # level-2 nodes 0, 1, 2 each have one value-1 leaf (their first child)
        leaf[0, 0, node, 0, 0] = 1.0
    types[0, 0, 0, 0, 0] = CLICK
    types[0, 0, 1, 0, 0] = CLICK
    types[0, 0, 2, 0, 0] = SCROLL
    vals = backup(leaf)
    assert pair_list(extract(vals, types, [CLICK], config=SMALL), turn=3) == [(0, 3, 0, 0, 1), (0, 3, 2, 6, 7)]
    pb = extract(vals, types, [CLICK], config=BIG)
    assert pair_list(pb, turn=3) == [
        (0, 3, 0, 0, 1),
        (0, 3, 2, 6, 7),
        (0, 3, 0, 0, 2),
        (0, 3, 2, 6, 8),
        (0, 3, 1, 3, 4),
        (0, 3, 1, 3, 5),
    ]


# ------------------------------------------------------------------------------------------------- γ pairs


def test_gamma_pairs_click_golden():
    leaf = np.zeros((2,) + B3, np.float32)
    types = np.full((2,) + B3, PRESS, np.int32)
    flat_l, flat_t = leaf.reshape(2, 27), types.reshape(2, 27)
    flat_l[0, [0, 1, 2, 3, 4, 5]] = [0.5, 0.0, 0.0, 0.3, 0.6, 0.0]
    flat_t[0, [0, 1, 2, 3, 4, 5]] = [CLICK, SCROLL, INVALID, CLICK, CLICK, TYPE]
    # row 1: golden "type"; a same-type leaf with the wrong text is a negative; no grounding pairs
    flat_l[1, 0], flat_t[1, 0], flat_t[1, 1] = 0.4, TYPE, CLICK
    vals = backup(leaf)
    golden = [CLICK, TYPE]
    pb = extract(vals, types, golden, config=BIG)
    row0_action = pair_list(pb, row=0, turn=3)
    assert sorted(n for *_, n in row0_action) == [1, 2, 5] + list(range(6, 27))
    assert all(pos == -1 and prefix == n // 3 for _, _, prefix, pos, n in row0_action)
    assert pair_list(pb, row=0, turn=4) == [(0, 4, 3, -1, 3), (0, 4, 0, -1, 0), (0, 4, 4, -1, 4)]
    assert sorted(n for *_, n in pair_list(pb, row=1, turn=3)) == list(range(27))
    assert pair_list(pb, row=1, turn=4) == [] and pair_list(pb, turn=1) == [] and pair_list(pb, turn=2) == []
    golden_flags = np.asarray(pb.positive_golden)[np.asarray(pb.valid)]
    assert golden_flags.all() and (np.asarray(pb.tree_class)[np.asarray(pb.valid)] == P.GAMMA).all()
    i = pair_list(pb).index((0, 4, 3, -1, 3))
    assert float(pb.value_gap[i]) == pytest.approx(0.7) and float(pb.positive_value[i]) == 1.0

    # default caps (9): one action-turn negative per thought (level-2 prefix), lowest value first
    pb = extract(vals, types, golden)
    assert [n for *_, n in pair_list(pb, row=0, turn=3)] == [1, 5, 6, 9, 12, 15, 18, 21, 24]
    assert [n for *_, n in pair_list(pb, row=0, turn=4)] == [3, 0, 4]
    np.testing.assert_array_equal(np.asarray(pb.count_by_turn), [0, 0, 18, 3])
    np.testing.assert_array_equal(np.asarray(pb.count_by_class), [0, 0, 21])


def test_gamma_pairs_with_action_text_information():
    leaf = np.zeros((1,) + B3, np.float32)
    types = np.full((1,) + B3, SCROLL, np.int32)
    leaf.reshape(27)[[0, 3]] = [0.5, 0.6]
    types.reshape(27)[[0, 3]] = CLICK
    same_text = np.zeros((1, 3, 3, 3), bool)
    same_text.reshape(27)[3] = True  # leaf 3 says the golden target, leaf 0 another one
    pb = extract(backup(leaf), types, [CLICK], config=BIG, text=same_text)
    assert sorted(n for *_, n in pair_list(pb, turn=3)) == sorted(set(range(27)) - {3})
    assert pair_list(pb, turn=4) == [(0, 4, 3, -1, 3)]
    # without the text information (all-True = "same text"): both same-type clicks go to the grounding turn
    pb = extract(backup(leaf), types, [CLICK], config=BIG)
    assert sorted(n for *_, n in pair_list(pb, turn=3)) == sorted(set(range(27)) - {0, 3})
    assert pair_list(pb, turn=4) == [(0, 4, 0, -1, 0), (0, 4, 3, -1, 3)]  # larger gap first


def test_no_pairs_from_alpha_or_padding_rows():
    rng = np.random.default_rng(1)
    leaf = rng.choice(np.float32([0.0, 0.3, 1.0]), size=(4,) + B3)
    leaf[0] = 1.0  # α
    leaf[1, 0, 0, 0, 0], leaf[1, 1, 0, 0, 0] = 1.0, 0.0  # β but padding
    leaf[2] = 0.0  # γ but padding
    types = rng.integers(-1, 6, size=(4,) + B3)
    pb = extract(backup(leaf, 0.95), types, [CLICK] * 4, valid=np.array([1, 0, 0, 1], bool))
    rows = {r for r, *_ in pair_list(pb)}
    assert rows <= {3} and int(pb.count_by_class[P.ALPHA]) == 0


# ------------------------------------------------------------------------------------------------- parity


def _reference_pairs(vals, types, golden, valid, cfg, branching):
    """Direct enumeration of docs/method.md §6 with the ranking rules of the module docstring, per (row, turn)."""
    leaf = vals[-1]
    Bn = leaf.shape[0]
    L = T.num_leaves(branching)
    paths = T.leaf_paths(branching)
    tol = cfg.one_tolerance
    out = []
    for b in range(Bn):
        ones = leaf[b].reshape(L) >= 1 - tol
        if not valid[b] or ones.all():
            continue
        lv, lt = leaf[b].reshape(L), types[b].reshape(L)
        if ones.any():  # β
            for t in range(1, 5):
                K = branching[t - 1]
                if K == 1:
                    continue
                v = vals[t - 1][b].reshape(-1)
                cands = []
                for p in range(T.num_nodes(branching, t - 1)):
                    for k in range(K):
                        below = np.nonzero(paths[:, t - 1] == p * K + k)[0]
                        tier = int((lv[below] >= 1 - tol).any())
                        ptype = lt[below[np.argmax(lv[below])]]
                        for k2 in range(K):
                            gap = np.float32(v[p * K + k] - v[p * K + k2])
                            if gap > np.float32(1 / K + cfg.gap_tolerance):
                                cands.append((tier, ptype, gap, (p * K + k) * K + k2, (b, t, p, p * K + k, p * K + k2)))
                out += _rank(cands, cfg.max_beta_pairs_per_tree_turn)
        else:  # γ
            click = golden[b] in P.CLICK_LIKE_TYPES
            b4 = branching[3]
            for t in (3, 4):
                n = T.num_nodes(branching, t)
                v = vals[t - 1][b].reshape(-1)
                cands = []
                for node in range(n):
                    first_leaf = node * (b4 if t == 3 else 1)
                    same = lt[first_leaf] == golden[b]
                    ok = (not (same and click)) if t == 3 else (same and click)
                    if ok:
                        thought = node // (branching[2] * (b4 if t == 4 else 1))
                        p = node // branching[t - 1]
                        cands.append((0, thought, np.float32(1 - v[node]), node, (b, t, p, -1, node)))
                out += _rank(cands, cfg.max_gamma_pairs_per_tree_turn)
    return out


def _rank(cands, cap):
    first = sorted(cands, key=lambda c: (-c[0], -c[2], c[3]))
    seen, ranked = {}, []
    for c in first:
        key = (c[0], c[1])
        ranked.append((-c[0], seen.get(key, 0), -c[2], c[3], c[4]))
        seen[key] = seen.get(key, 0) + 1
    return [c[-1] for c in sorted(ranked)[:cap]]


@pytest.mark.parametrize("branching,cfg", [((3, 3, 3, 1), P.PairConfig()), ((3, 3, 3, 1), BIG), ((2, 3, 2, 2), SMALL)])
def test_pairs_match_direct_enumeration_on_random_trees(branching, cfg):
    rng = np.random.default_rng(sum(branching) + cfg.max_beta_pairs_per_tree_turn)
    Bn = ROWS
    leaf = rng.choice(
        np.float32([0.0, 0.1, 0.25, 0.5, 0.75, 1.0]), p=[0.3, 0.1, 0.1, 0.1, 0.1, 0.3], size=(Bn,) + branching
    )
    leaf[0] = 1.0
    leaf[1] = rng.choice(np.float32([0.0, 0.2, 0.55]), size=branching)  # γ
    types = rng.choice([INVALID, CLICK, LONG, TYPE, SCROLL], size=(Bn,) + branching).astype(np.int32)
    types[:, :, :, :, 1:] = types[:, :, :, :, :1]  # leaves below one s3 share its action type
    golden = rng.choice([CLICK, TYPE, SCROLL], size=Bn)
    golden[1] = CLICK
    valid = np.ones(Bn, bool)
    valid[-1] = False
    vals = backup(leaf, 0.95)
    pb = extract(vals, types, golden, valid, config=cfg)
    ref = _reference_pairs(vals, types, golden, valid, cfg, branching)
    assert len(ref) > 10
    assert pair_list(pb) == ref
    assert int(pb.count) == len(ref) and int(pb.dropped) == 0
    np.testing.assert_array_equal(np.asarray(pb.count_by_turn), [sum(r[1] == t for r in ref) for t in (1, 2, 3, 4)])
    cls = np.asarray(P.classify_trees(jnp.asarray(leaf), jnp.asarray(valid)))
    np.testing.assert_array_equal(
        np.asarray(pb.count_by_class), [sum(cls[r[0]] == c for r in ref) for c in (P.ALPHA, P.BETA, P.GAMMA)]
    )
    # recorded values are the node values of the chosen nodes
    for i, (b, t, _, pos, neg) in enumerate(pair_list(pb)):
        v = vals[t - 1][b].reshape(-1)
        assert float(pb.negative_value[i]) == pytest.approx(v[neg])
        assert float(pb.positive_value[i]) == pytest.approx(1.0 if pos < 0 else v[pos])


def test_capacity_keeps_the_first_pairs_and_counts_the_rest():
    rng = np.random.default_rng(3)
    leaf = rng.choice(np.float32([0.0, 0.5, 1.0]), size=(4,) + B3)
    types = rng.integers(-1, 5, size=(4,) + B3)
    vals = backup(leaf, 0.95)
    full = extract(vals, types, [CLICK, TYPE, CLICK, SCROLL])
    small = extract(vals, types, [CLICK, TYPE, CLICK, SCROLL], capacity=5)
    total = int(full.count)
    assert total > 5 and small.capacity == 5 and full.capacity == ROWS * (9 * 3 + 9 * 2)
    assert int(small.count) == 5 and int(small.dropped) == total - 5
    assert pair_list(small) == pair_list(full)[:5]
    assert int(np.asarray(small.count_by_turn).sum()) == 5 and int(np.asarray(small.count_by_class).sum()) == 5


def test_shapes_fixed_and_no_recompilation_for_new_data():
    shapes, counts, traces = set(), [], []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        leaf = rng.choice(np.float32([0.0, 0.5, 1.0]), size=(ROWS,) + B3, p=[0.4, 0.2, 0.4])
        with count_traces() as traced:
            pb = extract(backup(leaf, 0.95), rng.integers(-1, 5, size=(ROWS,) + B3), rng.integers(0, 5, size=ROWS))
        shapes.add(tuple(x.shape for x in (pb.turn, pb.valid, pb.count_by_turn, pb.value_gap)))
        counts.append(int(pb.count))
        traces.append(traced["extract_pairs"])
    assert len(shapes) == 1 and len(set(counts)) > 1
    assert traces[0] <= 1 and traces[1] == traces[2] == 0
    # padding after the valid pairs
    assert not pb.valid[int(pb.count) :].any() and pb.valid[: int(pb.count)].all()


def test_bad_input_shapes_name_the_field():
    vals, types = _flat_beta_tree()
    vals, types = [jnp.asarray(v) for v in vals], jnp.asarray(types)
    golden, valid = jnp.zeros(4, jnp.int32), jnp.ones(4, bool)
    with pytest.raises(ValueError, match="leaf_types"):
        P.extract_pairs(vals, types[:, :2], golden, valid)
    with pytest.raises(ValueError, match=r"node_values\[level 2\]"):
        P.extract_pairs([vals[0], vals[1][:, :2], vals[2], vals[3]], types, golden, valid)
    with pytest.raises(ValueError, match="golden_types"):
        P.extract_pairs(vals, types, golden[:3], valid)
    with pytest.raises(ValueError, match="action_text_matches_golden"):
        P.extract_pairs(vals, types, golden, valid, action_text_matches_golden=jnp.ones((4, 3, 3), bool))


# ------------------------------------------------------------------------------------------------- tokens


def _identity_tree(Bn, branching, turn_lengths):
    """Each token says where it is: 1e6*row + 1e4*level + 10*node + position; lengths = node % T + 1."""
    tokens, lengths, logps = [], [], []
    for t in range(1, 5):
        n, Tt = T.num_nodes(branching, t), turn_lengths[t - 1]
        ids = (
            1000000 * np.arange(Bn)[:, None, None]
            + 10000 * t
            + 10 * np.arange(n)[None, :, None]
            + np.arange(Tt)[None, None, :]
        )
        shape = (Bn,) + branching[:t]
        tokens.append(jnp.asarray(ids.reshape(shape + (Tt,)).astype(np.int32)))
        logps.append(jnp.asarray((-ids.reshape(shape + (Tt,)) * 1e-7).astype(np.float32)))
        lengths.append(jnp.asarray(np.broadcast_to(np.arange(n, dtype=np.int32) % Tt + 1, (Bn, n)).reshape(shape)))
    finished = tuple(jnp.asarray(np.ones(x.shape, bool)) for x in lengths)
    return T.CoaTTree(
        tokens=tuple(tokens),
        lengths=tuple(lengths),
        logps=tuple(logps),
        finished=finished,
        step_index=jnp.asarray(np.arange(Bn, dtype=np.int32) + 100),
        step_valid=jnp.asarray(np.ones(Bn, bool)),
    ).validate()


def test_gather_pair_tokens_returns_the_right_nodes():
    branching, lens = B3, (6, 5, 4, 3)
    rng = np.random.default_rng(5)
    leaf = rng.choice(np.float32([0.0, 0.5, 1.0]), size=(ROWS,) + branching)
    leaf[1] = rng.choice(np.float32([0.0, 0.3]), size=branching)
    types = rng.choice([CLICK, SCROLL], size=(ROWS,) + branching)
    golden = np.array([CLICK, CLICK, SCROLL, CLICK] * 2)
    tr = _identity_tree(ROWS, branching, lens)
    pb = extract(backup(leaf, 0.95), types, golden)
    pb = pb.replace(step_index=np.where(pb.valid, pb.step_index + 100, 0))  # as if step_index = row + 100
    g_act = jnp.asarray(-1 - np.arange(ROWS * 7).reshape(ROWS, 7), jnp.int32)
    g_box = jnp.asarray(-500 - np.arange(ROWS * 2).reshape(ROWS, 2), jnp.int32)
    g_act_len, g_box_len = jnp.arange(ROWS) % 7 + 1, jnp.arange(ROWS) % 2 + 1
    pt = jax.tree_util.tree_map(np.asarray, PT.gather_pair_tokens(tr, pb, g_act, g_box, g_act_len, g_box_len))
    width = 7
    assert pt.positive_tokens.shape == (pb.capacity, width) and pt.prefix_tokens[0].shape == (pb.capacity, 6)
    seen_turns, seen_golden = set(), set()

    def ident(b, t, node):
        row = 1000000 * b + 10000 * t + 10 * node + np.arange(lens[t - 1])
        return np.concatenate([row, np.zeros(width - lens[t - 1], int)]), node % lens[t - 1] + 1

    for i, (b, t, prefix, pos, neg) in enumerate(pair_list(pb)):
        seen_turns.add(t)
        assert int(pt.step_index[i]) == 100 + b and int(pt.turn[i]) == t
        toks, n = ident(b, t, neg)
        np.testing.assert_array_equal(pt.negative_tokens[i], toks)
        assert int(pt.negative_lengths[i]) == n
        np.testing.assert_allclose(pt.negative_logps[i][: lens[t - 1]], -toks[: lens[t - 1]] * 1e-7, rtol=1e-6)
        if pos >= 0:
            toks, n = ident(b, t, pos)
        else:
            seen_golden.add(t)
            src, srclen = (g_act, g_act_len) if t == 3 else (g_box, g_box_len)
            toks = np.concatenate([np.asarray(src[b]), np.zeros(width - src.shape[1], int)])
            n = int(srclen[b])
            assert not np.asarray(pt.positive_logps[i]).any()
        np.testing.assert_array_equal(pt.positive_tokens[i], toks)
        assert int(pt.positive_lengths[i]) == n
        # prefix: ancestors of the level-(t-1) prefix node
        for lvl in range(1, 4):
            if lvl < t:
                node = T.ancestor_index(prefix, branching, t - 1, lvl)
                assert int(pt.prefix_path[i, lvl - 1]) == node
                toks, n = ident(b, lvl, node)
                np.testing.assert_array_equal(pt.prefix_tokens[lvl - 1][i], toks[: lens[lvl - 1]])
                assert int(pt.prefix_lengths[i, lvl - 1]) == n
            else:
                assert int(pt.prefix_path[i, lvl - 1]) == -1 and int(pt.prefix_lengths[i, lvl - 1]) == 0
    assert seen_turns == {1, 2, 3, 4} and seen_golden == {3, 4}
    invalid = ~np.asarray(pt.valid)
    assert invalid.any() and not np.asarray(pt.positive_lengths)[invalid].any()
    assert not pt.same_text.any()
    # a pair whose positive is the negative node itself has the same text on both sides
    i = next(i for i in range(pb.capacity) if pb.valid[i] and not pb.positive_golden[i])
    pb2 = pb.replace(positive_node=np.where(np.arange(pb.capacity) == i, pb.negative_node, pb.positive_node))
    same = np.asarray(PT.gather_pair_tokens(tr, pb2, g_act, g_box, g_act_len, g_box_len).same_text)
    np.testing.assert_array_equal(np.nonzero(same)[0], [i])


# ------------------------------------------------------------------------------------------------- naive DPO


def test_naive_dpo_pairs_and_tokens():
    leaf = np.full((4,) + B3, 0.5, np.float32)
    flat = leaf.reshape(4, 27)
    flat[0, [1, 3]] = 1.0
    flat[0, [7, 9]] = 0.0  # β: chosen 1 (first correct), rejected 7 (lowest value, first among ties)
    flat[1] = 1.0  # α: no pair
    flat[3, 20] = 1.0  # β, but padding
    valid = np.array([1, 1, 1, 0], bool)
    nd = PT.naive_dpo_pairs(jnp.asarray(leaf), jnp.asarray(valid))
    np.testing.assert_array_equal(np.asarray(nd.valid), [True, False, False, False])
    assert int(nd.chosen_leaf[0]) == 1 and int(nd.rejected_leaf[0]) == 7
    tr = _identity_tree(4, B3, (6, 5, 4, 3))
    out = PT.gather_naive_dpo_tokens(tr, nd)
    for name, leaf_id in (("chosen", 1), ("rejected", 7)):
        path = T.leaf_paths(B3)[leaf_id]
        for lvl in range(1, 5):
            n = int(path[lvl - 1])
            Tt = (6, 5, 4, 3)[lvl - 1]
            np.testing.assert_array_equal(out[f"{name}_tokens"][lvl - 1][0], 10000 * lvl + 10 * n + np.arange(Tt))
            assert int(out[f"{name}_lengths"][0, lvl - 1]) == n % Tt + 1
    assert not np.asarray(out["chosen_lengths"])[1:].any()


def test_accepts_node_values_from_rewards_backup():
    backup_values = pytest.importorskip("ipl_jax.coat.rewards").backup_values

    rng = np.random.default_rng(11)
    leaf = rng.choice(np.float32([0.0, 0.35, 0.7, 1.0]), size=(ROWS,) + B3)
    types = rng.integers(-1, 5, size=(ROWS,) + B3)
    golden = rng.integers(0, 5, size=ROWS)
    theirs = tuple(np.asarray(v) for v in backup_values(jnp.asarray(leaf), B3, discount=0.95))
    ours = backup(leaf, 0.95)
    assert_trees_close(theirs, ours, rtol=1e-6, atol=0)
    got, want = extract(theirs, types, golden), extract(ours, types, golden)
    assert int(got.count) > 0
    assert pair_list(got) == pair_list(want)
