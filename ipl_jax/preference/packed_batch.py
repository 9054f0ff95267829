"""The data types of prefix-packed T-DPO batches (built in ``preference.packing``). Shapes: ``B`` rows, ``T``
tokens, ``M`` continuation slots per row, ``P`` pair slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.model.inputs import DEFAULT_PATCH_BUCKETS, DEFAULT_TEXT_BUCKETS
from ipl_jax.model.vision import VisionInputs

PAD_SEGMENT = -1
PREFIX_SEGMENT = 0


@dataclasses.dataclass(frozen=True)
class PrefixGroup:
    """One shared prefix and its continuations (numpy, unpadded): prefix_ids int32[L] (last token text);
    continuations int32[n_i] (whole turns); scored bool[n_i] or None; pixel_values, image_grid_thw or None; name.
    """

    prefix_ids: np.ndarray
    continuations: tuple
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    scored: tuple | None = None
    name: str = ""

    def scored_mask(self, i: int) -> np.ndarray:
        n = len(self.continuations[i])
        return np.ones(n, bool) if self.scored is None else np.asarray(self.scored[i], bool).reshape(n)

    @property
    def row_length(self) -> int:
        """Tokens this group takes in a packed row: L - 1 + Σ n_i."""
        return len(self.prefix_ids) - 1 + sum(len(c) for c in self.continuations)


@dataclasses.dataclass(frozen=True)
class PairRef:
    """A pair of continuations ``pos`` / ``neg`` of group ``group``, with ``turn`` (0: whole trajectories) and, for
    selection, ``pos_type``, ``gap`` and ``tree_class`` (-1 unknown)."""

    group: int
    pos: int
    neg: int
    turn: int = 0
    pos_type: int = -1
    gap: float = 0.0
    tree_class: int = -1


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    """Fixed shapes of packed batches: rows (B), max_continuations (M), max_pairs (P), and text / per-row patch
    buckets (the smallest that fits is taken).
    """

    rows: int = 8
    max_continuations: int = 4
    max_pairs: int = 16
    text_buckets: tuple = DEFAULT_TEXT_BUCKETS
    patch_buckets: tuple = DEFAULT_PATCH_BUCKETS
    pad_id: int = 0

    def __post_init__(self):
        if self.rows < 1 or self.max_continuations < 1 or self.max_pairs < 1:
            raise ValueError(f"PackingConfig: rows, max_continuations and max_pairs must be >= 1, got {self}")
        object.__setattr__(self, "text_buckets", tuple(sorted(int(b) for b in self.text_buckets)))
        object.__setattr__(self, "patch_buckets", tuple(sorted(int(b) for b in self.patch_buckets)))


@struct.dataclass
class PackedBatch:
    """A fixed-shape batch of prefix-packed rows and the pairs that compare their continuations.

    input_ids, target_ids: int32[B, T]; positions: int32[3, B, T]; segment_ids: int32[B, T] (-1 pad, 0 prefix,
    i + 1 slot i); score_slot: int32[B, T] (-1 none); vision: [B, Pr, ...] or None; pair_pos / pair_neg: int32[P]
    (row * M + slot); pair_valid, pair_turn: [P]; ref_pos / ref_neg: f32[P] (0 until attached).
    """

    input_ids: jax.Array
    positions: jax.Array
    segment_ids: jax.Array
    target_ids: jax.Array
    score_slot: jax.Array
    vision: VisionInputs | None
    pair_pos: jax.Array
    pair_neg: jax.Array
    pair_valid: jax.Array
    pair_turn: jax.Array
    ref_pos: jax.Array
    ref_neg: jax.Array
    max_continuations: int = struct.field(pytree_node=False, default=1)

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def num_pairs(self) -> int:
        return int(np.sum(np.asarray(self.pair_valid)))

    def with_reference(self, ref_pos, ref_neg) -> PackedBatch:
        return self.replace(ref_pos=jnp.asarray(ref_pos, jnp.float32), ref_neg=jnp.asarray(ref_neg, jnp.float32))
