"""Tree comparisons for the tests: same structure, then every leaf compared by ``numpy.testing`` through
``jax.tree.map`` (the failing leaf named by its path)."""

import jax
import numpy as np


def assert_trees_equal(a, b) -> None:
    """Same structure, and every leaf of the same dtype, shape and values."""
    assert jax.tree.structure(a) == jax.tree.structure(b), (jax.tree.structure(a), jax.tree.structure(b))

    def same(path, x, y):
        x, y, where = np.asarray(x), np.asarray(y), jax.tree_util.keystr(path)
        assert x.dtype == y.dtype and x.shape == y.shape, (where, x.dtype, y.dtype, x.shape, y.shape)
        np.testing.assert_array_equal(x, y, err_msg=where)

    jax.tree_util.tree_map_with_path(same, a, b)
