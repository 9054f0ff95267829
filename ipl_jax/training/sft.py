"""Supervised fine-tuning: the masked next-token loss on assistant turns, and the Qwen2-VL SFT step
(``sft_step``; log-probs in chunks, never full logits).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import get_rope_index, prepare_vision, prepare_vision_slots
from ipl_jax.model.sharding import batch_spec
from ipl_jax.model.text import forward_hidden, token_log_probs
from ipl_jax.model.vision import encode_images
from ipl_jax.training.optimizer import OptimizerSettings, make_optimizer, make_schedule
from ipl_jax.training.state import TrainState, state_shardings
from ipl_jax.training.step import LossFn, train_step_fn


def next_token_nll(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(summed NLL f32[], token count f32[]) of the masked next tokens: token t+1 is scored at t iff loss_mask[t+1]."""
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    token_logp = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return -jnp.sum(token_logp * mask), jnp.sum(mask)


def sft_loss(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, dict]:
    """Mean next-token cross-entropy over assistant tokens. -> (loss f32[], {'tokens': f32[]})."""
    nll, tokens = next_token_nll(logits, input_ids, loss_mask)
    return nll / jnp.maximum(tokens, 1.0), {"tokens": tokens}


# ------------------------------------------------------------------------------------ SFT on the Qwen2-VL model


def sft_model_batch(cfg, batch, image_patches: int | None = None) -> dict:
    """Host side: a collated ``TrainingBatch`` -> numpy {input_ids, attention_mask, loss_mask, positions, vision}
    (no 'vision' without images); with ``image_patches`` one image slot per row slot.
    """
    ids = np.asarray(batch.input_ids, np.int32)
    mask = np.asarray(batch.attention_mask, bool)
    pixels, grids = batch.packed_images()
    rows = np.flatnonzero(mask.any(axis=1))
    positions = np.zeros((3, *ids.shape), np.int32)
    if rows.size:
        pos, _ = get_rope_index(ids[rows], mask[rows], grids if len(grids) else None, cfg)
        positions[:, rows] = pos
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        "loss_mask": np.asarray(batch.loss_mask, np.int32),
        "positions": positions,
    }
    if len(grids) and image_patches:
        slot_grids = np.where(np.asarray(batch.image_mask)[:, None], batch.image_grid_thw, 0)
        out["vision"] = prepare_vision_slots(cfg, pixels, slot_grids, int(image_patches))
    elif len(grids):
        out["vision"] = prepare_vision(cfg, pixels, grids, patch_buckets=(batch.pixel_values.shape[0],))
    return out


def sft_batch_axes(batch: Mapping[str, Any], grad_accum: bool = False) -> dict:
    """The row axis of every leaf of ``sft_model_batch`` arrays (1 for ``positions``; one more with ``grad_accum``)."""
    lead = 1 if grad_accum else 0
    out = {}
    for key, value in batch.items():
        if key == "vision":
            out[key] = jax.tree.map(lambda _: lead, value)
        else:
            out[key] = lead + (1 if key == "positions" else 0)
    return out


def sft_batch_shardings(batch: Mapping[str, Any], mesh, grad_accum: bool = False):
    """NamedShardings for ``sft_model_batch`` arrays: text and image patch rows split over the batch axes;
    ``grad_accum``: a leading unsharded micro-batch axis.
    """
    lead = 1 if grad_accum else 0

    def one(x, axis):
        spec = tuple(batch_spec(mesh, x.shape[lead:], axis - lead))
        return NamedSharding(mesh, PartitionSpec(*((None,) * lead + spec)))

    return jax.tree.map(one, dict(batch), sft_batch_axes(batch, grad_accum))


def qwen2vl_sft_loss(cfg, *, remat: bool | str = False, chunk: int = 128) -> LossFn:
    """loss_fn(params, batch, rng) for ``sft_model_batch`` arrays: mean next-token NLL over assistant tokens, from
    hidden states ``chunk`` positions at a time. ``remat``: a ``REMAT_POLICIES`` policy (True = 'full').
    """

    def loss_fn(params, batch, rng):
        del rng  # Qwen2-VL has no dropout
        # packed images, or one per slot (sft_model_batch's image_patches): encode_images takes both
        feats = encode_images(params, cfg, batch["vision"], remat=remat) if "vision" in batch else None
        ids = batch["input_ids"]
        hidden = forward_hidden(params, cfg, ids, batch["positions"], batch["attention_mask"], feats, remat=remat)
        # Position t predicts token t+1; the last position has no target (its mask entry is 0).
        targets = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
        target_mask = jnp.concatenate([batch["loss_mask"][:, 1:], jnp.zeros_like(batch["loss_mask"][:, :1])], 1)
        t = ids.shape[1]
        c = chunk if t % min(chunk, t) == 0 else t
        logp = token_log_probs(params, cfg, hidden, targets, chunk=c, needed=target_mask > 0)
        mask = target_mask.astype(jnp.float32)
        tokens = jnp.sum(mask)
        nll = -jnp.sum(logp * mask)
        return nll / jnp.maximum(tokens, 1.0), {"tokens": tokens}

    return loss_fn


@dataclasses.dataclass(frozen=True)
class SFTStepConfig:
    """Settings of the Qwen2-VL SFT step (hashable): ``model`` (compute dtype), ``grad_accum_steps``,
    ``compute_dtype`` (None: as held), ``remat``, ``logp_chunk``."""

    model: Qwen2VLConfig
    optimizer: OptimizerSettings
    grad_accum_steps: int = 1
    remat: bool | str = False
    compute_dtype: str | None = None
    logp_chunk: int = 128


def _sft_update(state: TrainState, batch, config: SFTStepConfig, mesh):
    """One update weighted by loss tokens; under a mesh rows and the new state are pinned to their shardings."""
    optimizer = make_optimizer(config.optimizer)
    accum = config.grad_accum_steps > 1
    if mesh is not None:
        batch = jax.lax.with_sharding_constraint(batch, sft_batch_shardings(batch, mesh, grad_accum=accum))
    step = train_step_fn(
        qwen2vl_sft_loss(config.model, remat=config.remat, chunk=config.logp_chunk),
        optimizer,
        schedule=make_schedule(config.optimizer),
        grad_accum_steps=config.grad_accum_steps,
        weight_key="tokens",
        compute_dtype=config.compute_dtype,
    )
    new_state, metrics = step(state, batch)
    if mesh is not None:
        new_state = jax.lax.with_sharding_constraint(new_state, state_shardings(state, optimizer, mesh))
    return new_state, metrics


# The one program of a Qwen2-VL SFT step, compiled once per (config, mesh, shapes) by jax.jit's own cache.
sft_update = jax.jit(_sft_update, static_argnums=(2, 3), donate_argnums=(0,))


def sft_step(state: TrainState, batch, config: SFTStepConfig, *, mesh=None):
    """One SFT update (``state`` donated; under ``mesh`` a global batch and placed state). Returns (state, metrics)."""
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        return sft_update(state, batch, config, mesh)


def lower_sft_step(state, batch, config: SFTStepConfig, mesh=None) -> jax.stages.Lowered:
    """``sft_update`` lowered for ``state`` / ``batch`` (arrays or sharded ``ShapeDtypeStruct`` s), for AOT figures."""
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        return sft_update.lower(state, batch, config, mesh)
