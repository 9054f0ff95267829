"""Fixed-shape batches: tokenised examples padded to length buckets and stacked, so each bucket compiles once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class TrainingExample:
    """One tokenised chat: input_ids, loss_mask (assistant text + ``<|im_end|>``), turn_index (1..4, 0 elsewhere)
    int32[T]; pixel_values float32[N, patch_dim]; image_grid_thw int64[n, 3]; name (for errors).
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    turn_index: np.ndarray
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    name: str = ""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def smallest_bucket(n: int, buckets: Sequence[int], what: str = "length") -> int:
    """The smallest bucket >= n (ValueError naming ``what`` when none fits)."""
    fitting = [int(b) for b in buckets if int(b) >= n]
    if not fitting:
        raise ValueError(f"{what} {n} exceeds the largest bucket {max(buckets) if buckets else None}")
    return min(fitting)


def pad_to_bucket(
    arrays: Mapping[str, np.ndarray],
    buckets: Sequence[int],
    pad_values: Mapping[str, Any] | None = None,
    axis: int = 0,
    what: str = "length",
) -> tuple[dict[str, np.ndarray], int]:
    """Pad every array along ``axis`` (all of one length n there) to the smallest bucket >= n.

    Returns (padded arrays, bucket). ``pad_values[name]`` defaults to 0.
    """
    pad_values = dict(pad_values or {})
    lengths = {k: np.shape(v)[axis] for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"pad_to_bucket: arrays differ in length along axis {axis}: {lengths}")
    n = next(iter(lengths.values())) if lengths else 0
    bucket = smallest_bucket(n, buckets, what)
    out = {}
    for k, v in arrays.items():
        v = np.asarray(v)
        widths = [(0, 0)] * v.ndim
        widths[axis] = (0, bucket - n)
        out[k] = np.pad(v, widths, constant_values=pad_values.get(k, 0))
    return out, bucket


@dataclasses.dataclass(frozen=True)
class TrainingBatch:
    """Fixed-shape arrays for B right-padded examples (padded rows fully masked; T and P are buckets).

    input_ids, loss_mask, turn_index: int32[B, T]; attention_mask: bool[B, T]; pixel_values: float32[P, patch_dim];
    patch_mask: bool[P]; image_grid_thw: int64[B*I, 3] (I image slots per row); image_mask: bool[B*I].
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    turn_index: np.ndarray
    pixel_values: np.ndarray
    patch_mask: np.ndarray
    image_grid_thw: np.ndarray
    image_mask: np.ndarray

    def packed_images(self) -> tuple[np.ndarray, np.ndarray]:
        """(pixel_values float32[N, D], image_grid_thw int64[n, 3]) without padding (HF processor layout)."""
        return self.pixel_values[self.patch_mask], self.image_grid_thw[self.image_mask]


def collate(
    examples: Sequence[TrainingExample],
    token_buckets: Sequence[int],
    patch_buckets: Sequence[int],
    pad_id: int,
    batch_size: int | None = None,
    images_per_example: int = 1,
) -> TrainingBatch:
    """Stack examples into fixed shapes: T and P the smallest token / patch buckets that fit, B = ``batch_size``
    (default: len(examples))."""
    b = len(examples) if batch_size is None else int(batch_size)
    if not examples or len(examples) > b:
        raise ValueError(f"collate: {len(examples)} examples for batch size {b}")
    longest = max(len(e) for e in examples)
    t = smallest_bucket(
        longest, token_buckets, "token length of example " + next(e.name for e in examples if len(e) == longest)
    )
    ids = np.full((b, t), pad_id, np.int32)
    att = np.zeros((b, t), bool)
    loss = np.zeros((b, t), np.int32)
    turn = np.zeros((b, t), np.int32)
    grids = np.zeros((b * images_per_example, 3), np.int64)
    img_mask = np.zeros((b * images_per_example,), bool)
    for i, e in enumerate(examples):
        n = len(e)
        ids[i, :n], att[i, :n], loss[i, :n], turn[i, :n] = e.input_ids, True, e.loss_mask, e.turn_index
        g = e.image_grid_thw.reshape(-1, 3)
        if len(g) > images_per_example:
            raise ValueError(f"example {e.name}: {len(g)} images, more than images_per_example={images_per_example}")
        grids[i * images_per_example : i * images_per_example + len(g)] = g
        img_mask[i * images_per_example : i * images_per_example + len(g)] = True
    pv = np.concatenate([e.pixel_values for e in examples], axis=0)
    padded, _ = pad_to_bucket(
        {"pixel_values": pv, "patch_mask": np.ones(len(pv), bool)}, patch_buckets, what="patch count"
    )
    return TrainingBatch(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss,
        turn_index=turn,
        pixel_values=padded["pixel_values"].astype(np.float32),
        patch_mask=padded["patch_mask"],
        image_grid_thw=grids,
        image_mask=img_mask,
    )
