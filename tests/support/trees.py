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


def assert_trees_close(a, b, *, rtol, atol) -> None:
    """Same structure, and every leaf of ``a`` of the same shape as ``b``'s and within ``atol + rtol * |b|``
    of it (``numpy.testing.assert_allclose``: ``b`` is the desired value)."""
    assert jax.tree.structure(a) == jax.tree.structure(b), (jax.tree.structure(a), jax.tree.structure(b))

    def close(path, x, y):
        x, y, where = np.asarray(x), np.asarray(y), jax.tree_util.keystr(path)
        assert x.shape == y.shape, (where, x.shape, y.shape)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=where)

    jax.tree_util.tree_map_with_path(close, a, b)
