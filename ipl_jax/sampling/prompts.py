"""Host-side inputs of the tree sampler: each step's prompt segments (``data.dialogue.coat_segments``), packed
into fixed-shape arrays (``TreePrompts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from flax import struct

from ipl_jax.data.dialogue import DEFAULT_PROMPTS, CoaTPrompts, coat_segments
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.data.screenshots import ScreenPixels, screen_pixels
from ipl_jax.model import ModelInputs, prepare_inputs
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import prepare_vision_slots
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.keys import step_keys, step_uid


@dataclasses.dataclass(frozen=True, init=False)
class StepPrompts:
    """One step's prompt segments: prefix_ids int32[P], turn_prompt_ids 3 x int32[Q_t], pixel_values (from
    ``pixels``), image_grid_thw int64[n, 3], uid.
    """

    prefix_ids: np.ndarray
    turn_prompt_ids: tuple[np.ndarray, np.ndarray, np.ndarray]
    pixels: ScreenPixels
    image_grid_thw: np.ndarray
    uid: int = 0

    def __init__(self, prefix_ids, turn_prompt_ids, pixel_values, image_grid_thw, uid: int = 0):
        if not isinstance(pixel_values, ScreenPixels):
            pixel_values = ScreenPixels.given(pixel_values, image_grid_thw)
        for k, v in zip(
            ("prefix_ids", "turn_prompt_ids", "pixels", "image_grid_thw", "uid"),
            (prefix_ids, turn_prompt_ids, pixel_values, image_grid_thw, uid),
        ):
            object.__setattr__(self, k, v)

    @property
    def pixel_values(self) -> np.ndarray:
        return self.pixels.values()


def step_prompts(
    step: Step,
    tokenizer,
    image_config: ImageProcessorConfig,
    cfg: Qwen2VLConfig,
    prompts: CoaTPrompts = DEFAULT_PROMPTS,
    image=None,
    pixels=None,
) -> StepPrompts:
    """A ``Step`` -> its ``StepPrompts`` (pixels decoded on first read unless ``image`` / ``pixels`` are given).
    ``cfg`` is checked against the image processor's merge size."""
    if cfg.vision.spatial_merge_size != image_config.merge_size:
        raise ValueError(
            f"image processor merge size {image_config.merge_size} != model spatial_merge_size "
            f"{cfg.vision.spatial_merge_size}"
        )
    if image is None and pixels is None:
        pixels = screen_pixels(step, image_config)
    seg = coat_segments(step, tokenizer, image_config, prompts, image=image, pixels=pixels)
    turns = tuple(np.asarray(seg.turn_prompt_ids[t], np.int32) for t in (2, 3, 4))
    for t, ids in zip((2, 3, 4), turns):
        if ids.size == 0:
            raise ValueError(f"step {seg.name}: the turn-{t} prompt is empty")
    return StepPrompts(
        prefix_ids=np.asarray(seg.prefix_ids, np.int32),
        turn_prompt_ids=turns,  # type: ignore
        pixel_values=seg.pixel_values,
        image_grid_thw=np.asarray(seg.image_grid_thw, np.int64),
        uid=step_uid(step.episode_id, step.step_id),
    )


@struct.dataclass
class TreePrompts:
    """A padded batch of B steps: prefix ModelInputs [B, P]; turn_prompt_ids 3 x int32[B, Q_t] and lengths
    int32[B, 3]; step_keys uint32[B, 2]; step_index, step_valid [B]; vision_rows (None: all rows).
    """

    prefix: ModelInputs
    turn_prompt_ids: tuple
    turn_prompt_lengths: np.ndarray
    step_keys: np.ndarray
    step_index: np.ndarray
    step_valid: np.ndarray
    vision_rows: tuple | None = struct.field(pytree_node=False, default=None)

    @property
    def batch_size(self) -> int:
        return int(self.step_index.shape[0])


def _padded_rows(items, step_index, batch_size) -> tuple[list, list[int], int, int]:
    """Check the steps and pad them to the batch by repeating the last one. Returns (rows, step indices, batch size
    b, real steps n)."""
    items = list(items)
    if not items:
        raise ValueError("pack_tree_prompts: no steps")
    n = len(items)
    b = n if batch_size is None else int(batch_size)
    if b < n:
        raise ValueError(f"pack_tree_prompts: {n} steps do not fit a batch of {b}")
    index = list(range(n)) if step_index is None else [int(i) for i in step_index]
    if len(index) != n:
        raise ValueError(f"pack_tree_prompts: {len(index)} step indices for {n} steps")
    return items + [items[-1]] * (b - n), index + [index[-1]] * (b - n), b, n


def _pack_prefix(cfg: Qwen2VLConfig, rows: list, config: SamplerConfig, vision_rows) -> ModelInputs:
    """The rows' shared prefixes (system, screenshot, instruction, turn 1) as ModelInputs [b, P], P the prefix
    bucket; with ``config.image_patches`` one image slot per row (only ``vision_rows``' when given)."""
    b = len(rows)
    prefix_len = config.prefix_bucket(max(len(r.prefix_ids) for r in rows))
    ids = np.full((b, prefix_len), config.pad_id, np.int32)
    mask = np.zeros((b, prefix_len), bool)
    for i, r in enumerate(rows):
        ids[i, : len(r.prefix_ids)] = r.prefix_ids
        mask[i, : len(r.prefix_ids)] = True
    grids = np.concatenate([r.image_grid_thw.reshape(-1, 3) for r in rows], axis=0)
    if config.image_patches:
        # the slots below replace the packed patches, which are never read: zeros stand in for them here (the
        # text, positions and checks need only the grids), so no screenshot is decoded for them
        shape = (int(np.prod(grids, axis=1).sum()), cfg.vision.patch_dim)
        pixel_values = np.broadcast_to(np.zeros((1, shape[1]), np.float32), shape)
    elif vision_rows is not None:
        raise ValueError("pack_tree_prompts: vision_rows needs config.image_patches (one image slot per row)")
    else:
        pixel_values = np.concatenate([r.pixel_values for r in rows], axis=0)
    prefix = prepare_inputs(
        cfg,
        ids,
        mask,
        pixel_values,
        grids,
        text_buckets=(prefix_len,),
        patch_buckets=config.patch_buckets,
        pad_id=config.pad_id,
    )
    if config.image_patches:  # one screenshot per slot, each encoded alone
        keep = range(b) if vision_rows is None else [int(i) for i in vision_rows]
        if vision_rows is not None and len({r.image_grid_thw.reshape(-1, 3).shape[0] for r in rows}) > 1:
            raise ValueError("pack_tree_prompts: vision_rows needs the same number of images in every row")
        kept = [rows[i] for i in keep]
        slots = prepare_vision_slots(
            cfg,
            np.concatenate([r.pixel_values for r in kept], axis=0),
            np.concatenate([r.image_grid_thw.reshape(-1, 3) for r in kept], axis=0),
            config.image_patches,
        )
        prefix = prefix.replace(vision=slots)
    return prefix


def _pack_turn_prompts(rows: list, config: SamplerConfig) -> tuple[tuple, np.ndarray]:
    """The turn-2..4 prompts of each row, padded to their buckets: (3 x int32[b, Q_t], lengths int32[b, 3])."""
    b = len(rows)
    prompt_ids, lengths = [], np.zeros((b, 3), np.int32)
    for t in range(3):
        q = config.prompt_bucket(max(len(r.turn_prompt_ids[t]) for r in rows))
        arr = np.full((b, q), config.pad_id, np.int32)
        for i, r in enumerate(rows):
            p = np.asarray(r.turn_prompt_ids[t], np.int32)
            if p.size == 0:
                raise ValueError(f"pack_tree_prompts: step row {i} has an empty turn-{t + 2} prompt")
            arr[i, : p.size] = p
            lengths[i, t] = p.size
        prompt_ids.append(arr)
    return tuple(prompt_ids), lengths


def pack_tree_prompts(
    cfg: Qwen2VLConfig,
    items: Sequence[StepPrompts],
    config: SamplerConfig,
    seed,
    step_index: Sequence[int] | None = None,
    batch_size: int | None = None,
    vision_rows: Sequence[int] | None = None,
) -> TreePrompts:
    """Pads ``items`` to ``batch_size`` rows (padding invalid) and ``config``'s buckets, keys from ``seed``; with
    ``config.image_patches`` only ``vision_rows``' image slots are built."""
    rows, index, b, n = _padded_rows(items, step_index, batch_size)
    if config.pad_id == cfg.image_token_id:
        raise ValueError("SamplerConfig.pad_id must not be the image token id")
    prefix = _pack_prefix(cfg, rows, config, vision_rows)
    prompt_ids, lengths = _pack_turn_prompts(rows, config)
    return TreePrompts(
        prefix=prefix,
        turn_prompt_ids=prompt_ids,
        turn_prompt_lengths=lengths,
        step_keys=step_keys(seed, [r.uid for r in rows]),
        step_index=np.asarray(index, np.int32),
        step_valid=np.arange(b) < n,
        vision_rows=None if vision_rows is None else tuple(int(i) for i in vision_rows),
    )
