"""CoaT-tree shapes and node-index algebra: known answers and agreement with numpy's ravel/unravel."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.coat import tree as T

BRANCHINGS = [(3, 3, 3, 1), (2, 2, 2, 1), (4, 4, 4, 1), (2, 3, 4, 2)]


def test_node_and_leaf_counts_known_answers():
    assert T.nodes_per_level((3, 3, 3, 1)) == (3, 9, 27, 27)
    assert T.num_leaves((3, 3, 3, 1)) == 27
    assert T.nodes_per_level((2, 2, 2, 1)) == (2, 4, 8, 8)
    assert T.nodes_per_level((4, 4, 4, 1)) == (4, 16, 64, 64)
    assert T.nodes_per_level((2, 3, 4, 2)) == (2, 6, 24, 48)
    assert T.num_nodes((3, 3, 3, 1), 0) == 1
    assert T.leaves_per_node((2, 3, 4, 2), 1) == 24
    assert T.leaves_per_node((2, 3, 4, 2), 0) == 48
    with pytest.raises(ValueError):
        T.num_nodes((3, 3, 3, 1), 5)
    with pytest.raises(ValueError):
        T.check_branching((3, 3, 3))
    with pytest.raises(ValueError):
        T.check_branching((3, 0, 3, 1))


@pytest.mark.parametrize("branching", BRANCHINGS)
def test_flatten_unflatten_agree_with_numpy(branching):
    for level in range(1, 5):
        shape = branching[:level]
        paths = np.array(list(itertools.product(*[range(k) for k in shape])))  # row-major order
        flat = T.flatten_node_index(tuple(paths.T), branching)
        np.testing.assert_array_equal(flat, np.ravel_multi_index(tuple(paths.T), shape))
        np.testing.assert_array_equal(flat, np.arange(len(paths)))
        back = T.unflatten_node_index(np.arange(len(paths)), branching, level)
        np.testing.assert_array_equal(np.stack(back, axis=1), paths)
        # parent = the path without its last choice
        if level > 1:
            parent = T.parent_index(flat, branching, level)
            np.testing.assert_array_equal(parent, T.flatten_node_index(tuple(paths[:, :-1].T), branching))
        else:
            np.testing.assert_array_equal(T.parent_index(flat, branching, 1), 0)


def test_flatten_works_on_jax_arrays():
    b = (3, 3, 3, 1)
    k = (jnp.array([2, 0]), jnp.array([1, 2]), jnp.array([0, 1]))
    np.testing.assert_array_equal(T.flatten_node_index(k, b), [21, 7])
    np.testing.assert_array_equal(np.stack(T.unflatten_node_index(jnp.array([21, 7]), b, 3)), np.stack(k))


def test_leaf_paths_known_rows():
    p = T.leaf_paths((3, 3, 3, 1))
    assert p.shape == (27, 4) and p.dtype == np.int32
    np.testing.assert_array_equal(p[13], [1, 4, 13, 13])
    np.testing.assert_array_equal(p[26], [2, 8, 26, 26])
    p = T.leaf_paths((2, 3, 4, 2))
    assert p.shape == (48, 4)
    # leaf 37 = path (1, 1, 2, 1): levels 1 = 1, 2 = 1*3+1 = 4, 3 = 4*4+2 = 18, 4 = 18*2+1 = 37
    np.testing.assert_array_equal(p[37], [1, 4, 18, 37])
    for leaf in range(48):
        path = np.unravel_index(leaf, (2, 3, 4, 2))
        for t in range(1, 5):
            assert p[leaf, t - 1] == np.ravel_multi_index(path[:t], (2, 3, 4, 2)[:t])


def test_level_reshapes_and_leaves_below():
    b = (2, 3, 4, 2)
    x = np.arange(5 * 48).reshape((5,) + b)
    flat3 = T.flatten_level(x.reshape((5,) + b[:3] + (2,)), 3)
    assert flat3.shape == (5, 24, 2)
    np.testing.assert_array_equal(T.unflatten_level(flat3, b, 3), x.reshape((5,) + b[:3] + (2,)))
    below = T.leaves_below(x, b, 2)  # [5, 6, 8]
    assert below.shape == (5, 6, 8)
    paths = T.leaf_paths(b)
    for n in range(6):
        leaves = np.nonzero(paths[:, 1] == n)[0]
        np.testing.assert_array_equal(below[:, n], x.reshape(5, 48)[:, leaves])


def _tree_with_identities(B, branching, turn_lengths):
    """A tree whose every token says where it is: 10000*level + 10*node + position."""
    tr = T.CoaTTree.zeros(B, branching, turn_lengths)
    tokens, lengths = [], []
    for t in range(1, 5):
        n = T.num_nodes(branching, t)
        ids = 10000 * t + 10 * np.arange(n)[:, None] + np.arange(turn_lengths[t - 1])[None, :]
        ids = np.broadcast_to(ids, (B, n, turn_lengths[t - 1])) + 1000000 * np.arange(B)[:, None, None]
        tokens.append(jnp.asarray(ids.reshape((B,) + branching[:t] + (turn_lengths[t - 1],)), jnp.int32))
        lengths.append(
            jnp.asarray(
                (np.arange(n) % turn_lengths[t - 1] + 1)[None].repeat(B, 0).reshape((B,) + branching[:t]), jnp.int32
            )
        )
    return tr.replace(
        tokens=tuple(tokens),
        lengths=tuple(lengths),
        step_index=jnp.arange(B, dtype=jnp.int32) + 7,
        step_valid=jnp.ones((B,), bool),
    )


def test_tree_shapes_pytree_and_node_lookup():
    tr = T.CoaTTree.zeros(2, (3, 3, 3, 1), (8, 6, 4, 5)).validate()
    assert tr.branching == (3, 3, 3, 1) and tr.turn_lengths == (8, 6, 4, 5) and tr.num_leaves == 27
    assert tr.tokens[2].shape == (2, 3, 3, 3, 4) and tr.logps[3].shape == (2, 3, 3, 3, 1, 5)
    assert tr.finished[1].shape == (2, 3, 3) and tr.finished[1].dtype == jnp.bool_
    assert len(jax.tree_util.tree_leaves(tr)) == 18
    # passes through jit as a pytree, shapes intact
    out = jax.jit(lambda x: x.replace(step_valid=~x.step_valid))(tr)
    assert out.tokens[3].shape == tr.tokens[3].shape and bool(out.step_valid.all())

    tr = _tree_with_identities(2, (2, 3, 4, 2), (5, 4, 3, 3))
    toks, n = tr.node_tokens(3, 1, 18)
    np.testing.assert_array_equal(toks, 1000000 + 30000 + 180 + np.arange(3))
    assert int(n) == 18 % 3 + 1


def test_validate_names_the_bad_field():
    tr = T.CoaTTree.zeros(2, (3, 3, 3, 1), (8, 6, 4, 4))
    bad = tr.replace(lengths=tr.lengths[:2] + (jnp.zeros((2, 3, 3, 2), jnp.int32),) + tr.lengths[3:])
    with pytest.raises(ValueError, match=r"lengths\[level 3\]"):
        bad.validate()
    bad = tr.replace(logps=tr.logps[:1] + (jnp.zeros((2, 3, 3, 6), jnp.int32),) + tr.logps[2:])
    with pytest.raises(ValueError, match=r"logps\[level 2\].*dtype"):
        bad.validate()
    with pytest.raises(ValueError, match="step_valid"):
        tr.replace(step_valid=jnp.zeros((3,), bool)).validate()
    with pytest.raises(ValueError, match="turn_lengths"):
        T.CoaTTree.zeros(2, (3, 3, 3, 1), (8, 6, 4))
