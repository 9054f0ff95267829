"""Fixed-shape training rows for the RL learners (one right-padded sequence per completion or critic state) and
the jitted forwards reading log-probs and hidden states off them; ``target_mask`` marks generated next tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.decode import last_valid_index
from ipl_jax.model.inputs import get_rope_index, pick_bucket, prepare_vision
from ipl_jax.model.text import forward_hidden, token_log_probs
from ipl_jax.model.vision import VisionInputs, encode_images_unjitted

DEFAULT_ROW_BUCKETS = (128, 256, 384, 512, 640, 768, 1024, 1536, 2048)
DEFAULT_IMAGE_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclasses.dataclass(frozen=True)
class RowConfig:
    """Row shapes: ``text_buckets`` (row length T), ``patch_buckets`` (all images of a batch),
    ``image_token_buckets`` (image tokens per row), ``pad_id`` (never the image token)."""

    text_buckets: tuple[int, ...] = DEFAULT_ROW_BUCKETS
    patch_buckets: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    image_token_buckets: tuple[int, ...] = DEFAULT_IMAGE_TOKEN_BUCKETS
    pad_id: int = 0


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One row before padding: ``segments`` (ids, generated?) in order; ``image``: the batch's image index."""

    segments: tuple
    image: int


@struct.dataclass
class Rows:
    """R rows of length T over U images: input_ids, targets int32[R, T]; attention_mask, target_mask bool[R, T];
    positions int32[3, R, T]; vision (U images); feature_index int32[F]; row_valid bool[R].
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    positions: jax.Array
    targets: jax.Array
    target_mask: jax.Array
    vision: VisionInputs | None
    feature_index: jax.Array
    row_valid: jax.Array

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])


def build_rows(
    cfg: Qwen2VLConfig, specs: Sequence[RowSpec], images: Sequence[tuple], n_rows: int, config: RowConfig = RowConfig()
) -> Rows:
    """Host side: ``specs`` (at most ``n_rows``, padded) and U ``images`` ((pixel_values, grid int[1, 3])) ->
    ``Rows``."""
    specs = list(specs)
    if not specs:
        raise ValueError("build_rows: no rows")
    if len(specs) > n_rows:
        raise ValueError(f"build_rows: {len(specs)} rows do not fit {n_rows}")
    if config.pad_id == cfg.image_token_id:
        raise ValueError("RowConfig.pad_id must not be the image token id")
    valid = np.arange(n_rows) < len(specs)
    specs = specs + [specs[0]] * (n_rows - len(specs))
    seqs, gens = [], []
    for s in specs:
        ids = [np.asarray(seg, np.int32).reshape(-1) for seg, _ in s.segments]
        seqs.append(np.concatenate(ids))
        gens.append(np.concatenate([np.full(len(i), bool(g)) for i, (_, g) in zip(ids, s.segments)]))
    t = pick_bucket(max(len(q) for q in seqs), config.text_buckets, "RL row length")
    ids = np.full((n_rows, t), config.pad_id, np.int32)
    mask = np.zeros((n_rows, t), bool)
    gen = np.zeros((n_rows, t), bool)
    for r, (q, g) in enumerate(zip(seqs, gens)):
        ids[r, : len(q)], mask[r, : len(q)], gen[r, : len(q)] = q, True, g
    target_mask = np.zeros_like(gen)
    target_mask[:, :-1] = gen[:, 1:]
    target_mask &= valid[:, None]
    targets = np.zeros_like(ids)
    targets[:, :-1] = ids[:, 1:]

    grids = [np.asarray(g, np.int64).reshape(-1, 3) for _, g in images]
    positions, _ = get_rope_index(ids, mask, np.concatenate([grids[s.image] for s in specs]), cfg)
    merge = cfg.vision.merge_factor
    n_tok = [int(np.sum(np.prod(g, axis=1))) // merge for g in grids]
    offsets = np.concatenate([[0], np.cumsum(n_tok)[:-1]]).astype(np.int64)
    per_row = pick_bucket(max(n_tok[s.image] for s in specs), config.image_token_buckets, "image tokens per row")
    index = np.zeros(n_rows * per_row, np.int32)
    pos = 0
    for s in specs:
        k = n_tok[s.image]
        index[pos : pos + k] = offsets[s.image] + np.arange(k)
        pos += k
    vision = prepare_vision(
        cfg,
        np.concatenate([np.asarray(p, np.float32) for p, _ in images]),
        np.concatenate(grids),
        patch_buckets=config.patch_buckets,
    )
    return Rows(
        input_ids=ids,
        attention_mask=mask,
        positions=positions,
        targets=targets,
        target_mask=target_mask,
        vision=vision,
        feature_index=index,
        row_valid=valid,
    )


def row_hidden(params: dict, cfg: Qwen2VLConfig, rows: Rows, remat: bool = False) -> jax.Array:
    """Final hidden states dtype[R, T, H] of every row (each image encoded once, its features gathered)."""
    feats = None
    if rows.vision is not None:
        feats = jnp.take(encode_images_unjitted(params, cfg, rows.vision), rows.feature_index, axis=0)
    return forward_hidden(params, cfg, rows.input_ids, rows.positions, rows.attention_mask, feats, remat=remat)


def _chunk(t: int, chunk: int) -> int:
    c = min(chunk, t)
    return c if t % c == 0 else t


def row_token_logps(
    params: dict, cfg: Qwen2VLConfig, rows: Rows, *, remat: bool = False, chunk: int = 128
) -> jax.Array:
    """log π(next token) f32[R, T], 0 where ``target_mask`` is False."""
    hidden = row_hidden(params, cfg, rows, remat)
    t = rows.input_ids.shape[1]
    return token_log_probs(params, cfg, hidden, rows.targets, chunk=_chunk(t, chunk), needed=rows.target_mask)


def last_hidden(params: dict, cfg: Qwen2VLConfig, rows: Rows, remat: bool = False) -> jax.Array:
    """f32[R, H]: the hidden state at each row's last valid token (a state's summary for the critic)."""
    hidden = row_hidden(params, cfg, rows, remat)
    idx = last_valid_index(rows.attention_mask)
    return jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0].astype(jnp.float32)


_logps_jit = jax.jit(
    lambda p, c, r, ch: jax.lax.stop_gradient(row_token_logps(p, c, r, chunk=ch)), static_argnums=(1, 3)
)


def frozen_token_logps(params: dict, cfg: Qwen2VLConfig, rows: Rows, chunk: int = 128) -> jax.Array:
    """``row_token_logps`` under ``stop_gradient`` in its own jitted program (reference / behaviour log-probs)."""
    return _logps_jit(params, cfg, rows, chunk)
