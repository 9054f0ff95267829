"""Random keys that depend on what is sampled, never on how it is batched: step keys from ``step_uid``, node keys
folded along the node's path, position keys per token; raw ``uint32[..., 2]`` key data.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.coat.tree import num_nodes, unflatten_node_index


def step_uid(episode_id: str, step_id: int) -> int:
    """A stable 31-bit id of a step (CRC-32 of ``episode_id``, NUL, ``step_id``)."""
    return zlib.crc32(f"{episode_id}\x00{int(step_id)}".encode()) & 0x7FFFFFFF


def base_key(seed: int | jax.Array) -> jax.Array:
    """uint32[2] raw key data from an int seed (or a raw key passed through)."""
    if isinstance(seed, (int, np.integer)):
        return jax.random.PRNGKey(int(seed))
    key = jnp.asarray(seed)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if key.shape != (2,) or key.dtype != jnp.uint32:
        raise ValueError(f"base_key: expected an int seed or uint32[2] key data, got {key.dtype}{list(key.shape)}")
    return key


def step_keys(seed: int | jax.Array, uids: Sequence[int]) -> np.ndarray:
    """uint32[B, 2]: the step key of each uid (see ``step_uid``)."""
    key = base_key(seed)
    uids = jnp.asarray(np.asarray(uids, dtype=np.int64).reshape(-1).astype(np.uint32))
    return np.asarray(jax.vmap(lambda u: jax.random.fold_in(key, u))(uids))


def node_keys(keys: jax.Array, branching: Sequence[int], level: int) -> jax.Array:
    """uint32[B, n_level, 2]: the key of every node of ``level`` (1..4) in flat node order, from step keys
    uint32[B, 2]: fold_in(..fold_in(fold_in(step, t), k1).., kt).
    """
    n = num_nodes(branching, level)

    def one(step_key, flat):
        k = jax.random.fold_in(step_key, level)
        for choice in unflatten_node_index(flat, branching, level):
            k = jax.random.fold_in(k, choice)
        return k

    per_step = jax.vmap(one, in_axes=(None, 0))
    return jax.vmap(per_step, in_axes=(0, None))(keys, jnp.arange(n, dtype=jnp.int32))


def position_keys(keys: jax.Array, position: int | jax.Array) -> jax.Array:
    """uint32[R, 2]: each node key folded with the token index ``position``."""
    return jax.vmap(lambda k: jax.random.fold_in(k, position))(keys)
