"""Host-side (numpy) preparation: Hugging Face style inputs -> fixed-shape arrays (``ModelInputs``): text
right-padded to a bucket, M-RoPE positions and rope deltas, patches padded to a bucket with rotary and
segment ids (-1 = pad).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flax import struct

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.vision import VisionInputs

DEFAULT_TEXT_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_PATCH_BUCKETS = (256, 1024, 2048, 4096, 8192, 16384, 32768)


@struct.dataclass
class ModelInputs:
    """A padded batch.

    input_ids: int32[B, T]; attention_mask: bool[B, T]; positions: int32[3, B, T]; rope_deltas: int32[B]
    (next text position = number of valid tokens + delta); vision: VisionInputs or None (text only).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    positions: np.ndarray
    rope_deltas: np.ndarray
    vision: VisionInputs | None = None


def pick_bucket(n: int, buckets: Sequence[int], what: str = "length") -> int:
    """The smallest bucket >= n."""
    for b in sorted(buckets):
        if b >= n:
            return int(b)
    raise ValueError(f"{what} {n} exceeds the largest bucket {max(buckets)}; add a bigger bucket")


def vision_position_ids(grid_thw: np.ndarray, merge: int) -> np.ndarray:
    """(row, column) of every patch, block-major over merge x merge blocks, repeated per temporal slice.
    grid_thw: int[n, 3] -> int32[sum(t*h*w), 2]."""
    out = []
    for t, h, w in np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3):
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        blk = (h // merge, merge, w // merge, merge)
        hh = hh.reshape(blk).transpose(0, 2, 1, 3).reshape(-1)
        ww = ww.reshape(blk).transpose(0, 2, 1, 3).reshape(-1)
        out.append(np.tile(np.stack([hh, ww], -1), (t, 1)))
    if not out:
        return np.zeros((0, 2), np.int32)
    return np.concatenate(out).astype(np.int32)


def vision_segment_ids(grid_thw: np.ndarray) -> np.ndarray:
    """One segment per temporal slice of each image (transformers' cu_seqlens). int32[sum(t*h*w)]."""
    out, seg = [], 0
    for t, h, w in np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3):
        for _ in range(t):
            out.append(np.full(h * w, seg, np.int32))
            seg += 1
    return np.concatenate(out) if out else np.zeros((0,), np.int32)


def get_rope_index(
    input_ids: np.ndarray, attention_mask: np.ndarray, image_grid_thw: np.ndarray | None, cfg: Qwen2VLConfig
) -> tuple[np.ndarray, np.ndarray]:
    """M-RoPE positions int32[3, B, T] and deltas int32[B], as transformers 5 computes them (masked slots: 0; each
    run of image-pad tokens takes the next ``image_grid_thw`` row).
    """
    ids = np.asarray(input_ids)
    mask = np.asarray(attention_mask).astype(bool)
    b, t = ids.shape
    m = cfg.vision.spatial_merge_size
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw).reshape(-1, 3)
    positions = np.zeros((3, b, t), np.int64)
    deltas = np.zeros((b,), np.int64)
    gi = 0
    for r in range(b):
        row = ids[r][mask[r]]
        if row.size == 0:
            raise ValueError(f"batch row {r} has no valid tokens")
        if np.any(row == cfg.video_token_id):
            raise ValueError(f"batch row {r} contains video tokens (id {cfg.video_token_id}); videos are not supported")
        is_img = row == cfg.image_token_id
        pieces, cur, i = [], 0, 0
        while i < row.size:
            j = i
            while j < row.size and is_img[j] == is_img[i]:
                j += 1
            n = j - i
            if not is_img[i]:
                pieces.append(np.broadcast_to(cur + np.arange(n), (3, n)))
                cur += n
            else:
                if gi >= len(grids):
                    raise ValueError(f"batch row {r}: more image-token runs than rows in image_grid_thw ({len(grids)})")
                gt, gh, gw = (int(x) for x in grids[gi])
                gi += 1
                lh, lw = gh // m, gw // m
                if gt * lh * lw != n:
                    raise ValueError(
                        f"batch row {r}: an image-token run has {n} tokens but its grid "
                        f"{[gt, gh, gw]} gives {gt * lh * lw}"
                    )
                tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(lh), np.arange(lw), indexing="ij")
                pieces.append(np.stack([tt.ravel() + cur, hh.ravel() + cur, ww.ravel() + cur]))
                cur += max(gh, gw) // m
            i = j
        pos = np.concatenate(pieces, axis=1)
        positions[:, r, mask[r]] = pos
        deltas[r] = pos.max() + 1 - row.size
    if gi != len(grids):
        raise ValueError(f"image_grid_thw has {len(grids)} rows but the text has {gi} image-token runs")
    return positions.astype(np.int32), deltas.astype(np.int32)


def prepare_vision(
    cfg: Qwen2VLConfig,
    pixel_values: np.ndarray,
    image_grid_thw: np.ndarray,
    patch_buckets: Sequence[int] = DEFAULT_PATCH_BUCKETS,
) -> VisionInputs:
    """Pads the packed patches of all images to a bucket. pixel_values: f32[N, patch_dim]; image_grid_thw:
    int[n, 3] with sum(t*h*w) = N."""
    v = cfg.vision
    pv = np.asarray(pixel_values, dtype=np.float32)
    grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    if pv.ndim != 2 or pv.shape[1] != v.patch_dim:
        raise ValueError(f"pixel_values must be [N, {v.patch_dim}], got {pv.shape}")
    n = int(np.sum(np.prod(grids, axis=1)))
    if n != pv.shape[0]:
        raise ValueError(f"image_grid_thw covers {n} patches but pixel_values has {pv.shape[0]} rows")
    if np.any(grids[:, 1:] % v.spatial_merge_size):
        raise ValueError(f"image grids {grids.tolist()} are not multiples of the merge size {v.spatial_merge_size}")
    p = pick_bucket(n, patch_buckets, "patch count")
    if p % v.merge_factor:
        raise ValueError(f"patch bucket {p} is not a multiple of {v.merge_factor}")
    patches = np.zeros((p, v.patch_dim), np.float32)
    patches[:n] = pv
    pos = np.zeros((p, 2), np.int32)
    pos[:n] = vision_position_ids(grids, v.spatial_merge_size)
    seg = np.full((p,), -1, np.int32)
    seg[:n] = vision_segment_ids(grids)
    return VisionInputs(patches=patches, pos_hw=pos, segment_ids=seg)


def prepare_vision_slots(
    cfg: Qwen2VLConfig, pixel_values: np.ndarray, image_grid_thw: np.ndarray, slot_patches: int
) -> VisionInputs:
    """One image per slot: leaves [N, slot_patches, ...] for the N images of ``image_grid_thw`` (int[N, 3], in
    ``pixel_values``' row order; an all-zero grid is an empty slot), each padded alone."""
    pv = np.asarray(pixel_values, dtype=np.float32)
    grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    sizes = np.prod(grids, axis=1)
    if int(sizes.sum()) != pv.shape[0]:
        raise ValueError(f"image_grid_thw covers {int(sizes.sum())} patches but pixel_values has {pv.shape[0]} rows")
    if np.any(grids[:, 0] > 1):
        raise ValueError(f"one image per slot needs single-frame grids (t = 1), got image_grid_thw {grids.tolist()}")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    slots = []
    for i, g in enumerate(grids):
        if sizes[i] == 0:
            slots.append(prepare_vision(cfg, pv[:0], np.zeros((0, 3), np.int64), (slot_patches,)))
        else:
            slots.append(prepare_vision(cfg, pv[starts[i] : starts[i + 1]], g[None], (slot_patches,)))
    return VisionInputs(*(np.stack([getattr(v, f) for v in slots]) for f in ("patches", "pos_hw", "segment_ids")))


def _as_batch(input_ids, attention_mask) -> tuple[np.ndarray, np.ndarray]:
    """Accepts int[B, T] (+ mask) or a list of 1-D sequences of different lengths (right-padded here)."""
    if isinstance(input_ids, (list, tuple)) and input_ids and not np.isscalar(input_ids[0]):
        rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in input_ids]
        if attention_mask is None and len({len(r) for r in rows}) > 1:
            t = max(len(r) for r in rows)
            ids = np.zeros((len(rows), t), np.int64)
            mask = np.zeros((len(rows), t), bool)
            for i, r in enumerate(rows):
                ids[i, : len(r)] = r
                mask[i, : len(r)] = True
            return ids, mask
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim == 1:
        ids = ids[None]
    mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    if mask.ndim == 1:
        mask = mask[None]
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    return ids, mask


def prepare_inputs(
    cfg: Qwen2VLConfig,
    input_ids,
    attention_mask=None,
    pixel_values=None,
    image_grid_thw=None,
    *,
    text_buckets: Sequence[int] = DEFAULT_TEXT_BUCKETS,
    patch_buckets: Sequence[int] = DEFAULT_PATCH_BUCKETS,
    pad_id: int = 0,
) -> ModelInputs:
    """HF-style inputs -> ModelInputs (numpy). input_ids: int[B, T] or 1-D sequences; attention_mask: {0,1}[B, T]
    or None; pixel_values: f32[N, patch_dim] or None; image_grid_thw: int[n, 3] or None.
    """
    ids, mask = _as_batch(input_ids, attention_mask)
    if pad_id == cfg.image_token_id:
        raise ValueError("pad_id must not be the image token id")
    n_img_tokens = int(np.sum((ids == cfg.image_token_id) & mask))
    vision = None
    if pixel_values is not None:
        if image_grid_thw is None:
            raise ValueError("pixel_values given without image_grid_thw")
        vision = prepare_vision(cfg, pixel_values, image_grid_thw, patch_buckets)
        grids = np.asarray(image_grid_thw).reshape(-1, 3)
        n_merged = int(np.sum(np.prod(grids, axis=1))) // cfg.vision.merge_factor
        if n_merged != n_img_tokens:
            raise ValueError(f"the text has {n_img_tokens} image tokens but the images give {n_merged} features")
    elif n_img_tokens:
        raise ValueError(f"the text has {n_img_tokens} image tokens but no pixel_values were given")
    if np.any((ids == cfg.image_token_id) & ~mask):
        raise ValueError("image tokens found in masked (padding) positions")
    positions, deltas = get_rope_index(ids, mask, image_grid_thw if vision is not None else None, cfg)
    b, t = ids.shape
    tb = pick_bucket(t, text_buckets, "text length")
    out_ids = np.full((b, tb), pad_id, np.int32)
    out_ids[:, :t] = np.where(mask, ids, pad_id)
    out_mask = np.zeros((b, tb), bool)
    out_mask[:, :t] = mask
    out_pos = np.zeros((3, b, tb), np.int32)
    out_pos[:, :, :t] = positions
    return ModelInputs(input_ids=out_ids, attention_mask=out_mask, positions=out_pos, rope_deltas=deltas, vision=vision)
