"""The CoaT-tree: a fixed-shape batch of sampled four-turn Chain-of-Action-Thought trees (docs/method.md §3).

Level t arrays have one axis per branching factor up to t ([B, b1, ..., bt]). A node's flat index is its path
``(k1, ..., kt)`` in row-major order; the parent of flat node n at level t is n // bt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

DEFAULT_BRANCHING = (3, 3, 3, 1)
NUM_TURNS = 4
TURN_NAMES = ("description", "thought", "action", "grounding")
ACTION_TURN = 3  # s3
GROUNDING_TURN = 4  # s4

IntLike = int | np.ndarray | jax.Array


# --------------------------------------------------------------------------------------------- index algebra


def check_branching(branching: Sequence[int]) -> tuple[int, ...]:
    """Validate a branching tuple (four positive ints) and return it as a tuple."""
    b = tuple(int(k) for k in branching)
    if len(b) != NUM_TURNS or any(k < 1 for k in b):
        raise ValueError(f"branching must be {NUM_TURNS} positive ints (one per CoaT turn), got {tuple(branching)}")
    return b


def num_nodes(branching: Sequence[int], level: int) -> int:
    """Nodes per tree at ``level`` (0 = root -> 1; t -> b1·…·bt)."""
    if not 0 <= level <= len(branching):
        raise ValueError(f"level must be in 0..{len(branching)}, got {level}")
    return math.prod(branching[:level])


def nodes_per_level(branching: Sequence[int]) -> tuple[int, ...]:
    """``(n_1, ..., n_4)``: nodes per tree at each level. (3,3,3,1) -> (3, 9, 27, 27)."""
    return tuple(num_nodes(branching, t) for t in range(1, len(branching) + 1))


def num_leaves(branching: Sequence[int]) -> int:
    """Leaves per tree (= nodes at the last level). (3,3,3,1) -> 27."""
    return math.prod(branching)


def leaves_per_node(branching: Sequence[int], level: int) -> int:
    """Leaves below one node of ``level`` (level 0: the whole tree)."""
    return math.prod(branching[level:])


def flatten_node_index(path: Sequence[IntLike], branching: Sequence[int]) -> IntLike:
    """Flat index of the level-``len(path)`` node with child choices ``path``; elementwise on ints or arrays."""
    flat = 0
    for t, k in enumerate(path):
        flat = flat * branching[t] + k
    return flat


def unflatten_node_index(flat: IntLike, branching: Sequence[int], level: int) -> tuple[IntLike, ...]:
    """Inverse of :func:`flatten_node_index`: the path ``(k1, ..., k_level)`` of flat node ``flat``."""
    path = []
    for t in range(level - 1, -1, -1):
        path.append(flat % branching[t])
        flat = flat // branching[t]
    return tuple(reversed(path))


def ancestor_index(flat: IntLike, branching: Sequence[int], level: int, ancestor_level: int) -> IntLike:
    """Flat index at ``ancestor_level`` (<= level) of the ancestor of flat node ``flat`` of ``level``."""
    if not 0 <= ancestor_level <= level:
        raise ValueError(f"ancestor_level must be in 0..{level}, got {ancestor_level}")
    return flat // math.prod(branching[ancestor_level:level])


def parent_index(flat: IntLike, branching: Sequence[int], level: int) -> IntLike:
    """Flat index at ``level - 1`` of the parent of flat node ``flat`` of ``level`` (level 1 -> root 0)."""
    return ancestor_index(flat, branching, level, level - 1)


def leaf_paths(branching: Sequence[int]) -> np.ndarray:
    """For each leaf its flat node index at every level: int32[L, 4] (column 4 the leaf itself)."""
    depth = len(branching)
    leaves = np.arange(num_leaves(branching), dtype=np.int64)
    cols = [ancestor_index(leaves, branching, depth, t) for t in range(1, depth + 1)]
    return np.stack(cols, axis=1).astype(np.int32)


def flatten_level(x: jax.Array, level: int, batch_dims: int = 1) -> jax.Array:
    """Merge the ``level`` branching axes after ``batch_dims`` leading axes: [B, b1..bt, ...] -> [B, n_t, ...]."""
    lead = x.shape[:batch_dims]
    rest = x.shape[batch_dims + level :]
    return x.reshape(lead + (math.prod(x.shape[batch_dims : batch_dims + level]),) + rest)


def unflatten_level(x: jax.Array, branching: Sequence[int], level: int, batch_dims: int = 1) -> jax.Array:
    """Inverse of :func:`flatten_level`: [B, n_t, ...] -> [B, b1..bt, ...]."""
    lead = x.shape[:batch_dims]
    rest = x.shape[batch_dims + 1 :]
    return x.reshape(lead + tuple(branching[:level]) + rest)


def leaves_below(leaf_array: jax.Array, branching: Sequence[int], level: int) -> jax.Array:
    """Group a per-leaf array [B, b1, b2, b3, b4, ...] by its level ancestor -> [B, n_level, leaves_per_node, ...]."""
    rest = leaf_array.shape[1 + len(branching) :]
    return leaf_array.reshape(
        (leaf_array.shape[0], num_nodes(branching, level), leaves_per_node(branching, level)) + rest
    )


# --------------------------------------------------------------------------------------------- the tree


@struct.dataclass
class CoaTTree:
    """A batch of ``B`` CoaT-trees (a pytree); per level t: ``tokens`` int32[B, b1..bt, T_t], ``lengths``
    int32[B, b1..bt], ``logps`` f32[B, b1..bt, T_t], ``finished`` bool[B, b1..bt]; per tree: ``step_index`` and
    ``step_valid`` [B].
    """

    tokens: tuple[jax.Array, jax.Array, jax.Array, jax.Array]
    lengths: tuple[jax.Array, jax.Array, jax.Array, jax.Array]
    logps: tuple[jax.Array, jax.Array, jax.Array, jax.Array]
    finished: tuple[jax.Array, jax.Array, jax.Array, jax.Array]
    step_index: jax.Array
    step_valid: jax.Array

    @property
    def batch_size(self) -> int:
        return int(self.step_index.shape[0])

    @property
    def branching(self) -> tuple[int, ...]:
        """(b1, b2, b3, b4), read from the level-4 token array's shape."""
        return tuple(int(k) for k in self.tokens[-1].shape[1 : 1 + NUM_TURNS])

    @property
    def turn_lengths(self) -> tuple[int, ...]:
        """(T_1, ..., T_4): the token budget of each turn."""
        return tuple(int(x.shape[-1]) for x in self.tokens)

    @property
    def num_leaves(self) -> int:
        return num_leaves(self.branching)

    @classmethod
    def zeros(
        cls,
        batch_size: int,
        branching: Sequence[int] = DEFAULT_BRANCHING,
        turn_lengths: Sequence[int] = (256, 128, 32, 32),
        pad_id: int = 0,
    ) -> CoaTTree:
        """An empty tree batch of the given shapes (tokens = ``pad_id``, lengths 0, nothing finished or valid)."""
        b = check_branching(branching)
        if len(turn_lengths) != NUM_TURNS or any(int(t) < 1 for t in turn_lengths):
            raise ValueError(f"turn_lengths must be {NUM_TURNS} positive ints, got {tuple(turn_lengths)}")
        shapes = [(batch_size,) + b[:t] for t in range(1, NUM_TURNS + 1)]
        return cls(
            tokens=tuple(jnp.full(s + (int(T),), pad_id, jnp.int32) for s, T in zip(shapes, turn_lengths)),
            lengths=tuple(jnp.zeros(s, jnp.int32) for s in shapes),
            logps=tuple(jnp.zeros(s + (int(T),), jnp.float32) for s, T in zip(shapes, turn_lengths)),
            finished=tuple(jnp.zeros(s, bool) for s in shapes),
            step_index=jnp.zeros((batch_size,), jnp.int32),
            step_valid=jnp.zeros((batch_size,), bool),
        )

    def validate(self) -> CoaTTree:
        """Check every field's shape and dtype against the branching; raise ValueError naming the field."""
        for name in ("tokens", "lengths", "logps", "finished"):
            if len(getattr(self, name)) != NUM_TURNS:
                raise ValueError(f"CoaTTree.{name}: expected {NUM_TURNS} levels, got {len(getattr(self, name))}")
        b = check_branching(self.branching)
        B = self.batch_size
        for t in range(1, NUM_TURNS + 1):
            node_shape = (B,) + b[:t]
            T = self.tokens[t - 1].shape[-1] if self.tokens[t - 1].ndim else None
            expected = {
                "tokens": (node_shape + (T,), jnp.integer),
                "lengths": (node_shape, jnp.integer),
                "logps": (node_shape + (T,), jnp.floating),
                "finished": (node_shape, jnp.bool_),
            }
            for name, (shape, kind) in expected.items():
                x = getattr(self, name)[t - 1]
                if tuple(x.shape) != shape:
                    raise ValueError(f"CoaTTree.{name}[level {t}]: shape {tuple(x.shape)}, expected {shape}")
                if not jnp.issubdtype(x.dtype, kind):
                    raise ValueError(f"CoaTTree.{name}[level {t}]: dtype {x.dtype}, expected {kind.__name__}")
        for name, kind in (("step_index", jnp.integer), ("step_valid", jnp.bool_)):
            x = getattr(self, name)
            if tuple(x.shape) != (B,) or not jnp.issubdtype(x.dtype, kind):
                raise ValueError(
                    f"CoaTTree.{name}: shape {tuple(x.shape)} dtype {x.dtype}, expected [{B}] {kind.__name__}"
                )
        return self

    def level_flat(self, name: str, level: int) -> jax.Array:
        """Field ``name`` of ``level`` with the branching axes merged: [B, n_level, ...]."""
        return flatten_level(getattr(self, name)[level - 1], level)

    def node_tokens(self, level: int, batch_row: IntLike, node: IntLike) -> tuple[jax.Array, jax.Array]:
        """Token ids int32[..., T_level] and length int32[...] of flat node ``node`` of tree row ``batch_row``."""
        return (
            self.level_flat("tokens", level)[batch_row, node],
            self.level_flat("lengths", level)[batch_row, node],
        )
