"""Supervised fine-tuning: the masked next-token loss on assistant turns, and the Qwen2-VL SFT step.

* ``sft_loss`` / ``make_sft_loss`` / ``make_sft_step`` — masked next-token cross-entropy for any
  ``logits_fn(params, batch, rng)``, weighted by tokens across micro-batches.
* Qwen2-VL: ``sft_model_batch(cfg, TrainingBatch)`` (host: collated dialogue batch -> ids, masks, M-RoPE
  positions, padded vision inputs), ``make_qwen2vl_sft_step(cfg, optimizer, schedule, ...)`` (the loss reads
  log-probs from hidden states in chunks, never the full logits), ``sft_batch_shardings`` for a mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax.model.inputs import get_rope_index, prepare_vision, prepare_vision_slots
from ipl_jax.model.sharding import batch_spec
from ipl_jax.model.text import forward_hidden, token_log_probs
from ipl_jax.model.vision import encode_images
from ipl_jax.training.step import LossFn, make_train_step


def next_token_nll(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed NLL of the masked next tokens and their count.

    logits: f32[B, T, V] (position t predicts token t+1); input_ids: int32[B, T]; loss_mask: bool/int[B, T], 1 on
    tokens to be predicted (assistant-turn tokens). The mask is shifted with the targets: token t+1 is scored at
    position t iff loss_mask[t+1]; token 0 is never scored. Returns (nll_sum f32[], tokens f32[]).
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    token_logp = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return -jnp.sum(token_logp * mask), jnp.sum(mask)


def sft_loss(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, dict]:
    """Mean next-token cross-entropy over assistant tokens. -> (loss f32[], {'tokens': f32[]})."""
    nll, tokens = next_token_nll(logits, input_ids, loss_mask)
    return nll / jnp.maximum(tokens, 1.0), {"tokens": tokens}


def make_sft_loss(logits_fn: Callable[[Any, Any, jax.Array], jax.Array]) -> LossFn:
    """loss_fn for ``make_train_step`` from ``logits_fn(params, batch, rng) -> f32[B, T, V]``.

    ``batch`` is a mapping with at least ``input_ids`` int32[B, T] and ``loss_mask`` [B, T]. Use with
    ``weight_key='tokens'``.
    """

    def loss_fn(params, batch, rng):
        logits = logits_fn(params, batch, rng)
        return sft_loss(logits, batch["input_ids"], batch["loss_mask"])

    return loss_fn


def make_sft_step(logits_fn, optimizer, schedule=None, **kwargs):
    """``sft_step(state, batch) -> (state, metrics)``: the generic step with the SFT loss, weighted by tokens.

    metrics: loss, tokens, grad_norm, lr. ``kwargs`` go to ``make_train_step`` (grad_accum_steps, compute_dtype,
    mesh, state_shardings, batch_shardings).
    """
    return make_train_step(make_sft_loss(logits_fn), optimizer, schedule=schedule, weight_key="tokens", **kwargs)


# ------------------------------------------------------------------------------------ SFT on the Qwen2-VL model


def sft_model_batch(cfg, batch, image_patches: int | None = None) -> dict:
    """Host-side: a collated ``data.batching.TrainingBatch`` -> the arrays the Qwen2-VL SFT loss reads.

    Returns numpy arrays {input_ids int32[B, T], attention_mask bool[B, T], loss_mask int32[B, T],
    positions int32[3, B, T] (M-RoPE, computed here), vision: model.VisionInputs with P = the batch's patch
    bucket} (no 'vision' key for a batch without images). Fully padded rows get position 0 and no loss.
    With ``image_patches``, the vision leaves are [B*I, image_patches, ...] instead: one image slot per row slot
    (``prepare_vision_slots``), so the loss encodes each image alone (cost linear in the images per batch, not
    quadratic) and the slot axis can be split over devices.
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
    """The row (example) axis of every leaf of ``sft_model_batch`` arrays, a pytree like ``batch``: 0 for the
    text arrays and the image slots (one slot per row), 1 for ``positions`` [3, B, T]; one more with
    ``grad_accum`` (a leading micro-batch axis [A, ...])."""
    lead = 1 if grad_accum else 0
    out = {}
    for key, value in batch.items():
        if key == "vision":
            out[key] = jax.tree.map(lambda _: lead, value)
        else:
            out[key] = lead + (1 if key == "positions" else 0)
    return out


def sft_batch_shardings(batch: Mapping[str, Any], mesh, grad_accum: bool = False):
    """NamedShardings for ``sft_model_batch`` arrays: text split over the batch axes, and the image patch rows
    too (packed in batch order: with images of one size each device gets the images of its own rows).

    ``grad_accum``: leaves carry a leading micro-batch axis [A, ...] (kept unsharded).
    """
    lead = 1 if grad_accum else 0

    def one(x, axis):
        spec = tuple(batch_spec(mesh, x.shape[lead:], axis - lead))
        return NamedSharding(mesh, PartitionSpec(*((None,) * lead + spec)))

    return jax.tree.map(one, dict(batch), sft_batch_axes(batch, grad_accum))


def qwen2vl_sft_loss(cfg, *, remat: bool | str = False, chunk: int = 128) -> LossFn:
    """loss_fn(params, batch, rng) for ``sft_model_batch`` arrays: mean next-token NLL over assistant tokens.

    Log-probs come from the final hidden states ``chunk`` positions at a time (``model.token_log_probs``), so the
    full [B, T, V] logits are never materialised. ``remat``: the policy (``model.layers.REMAT_POLICIES``, True =
    'full') of the decoder layers and the vision blocks in the backward pass.
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


def make_qwen2vl_sft_step(cfg, optimizer, schedule=None, *, remat: bool | str = False, chunk: int = 128, **kwargs):
    """``sft_step(state, batch) -> (state, metrics)`` for the Qwen2-VL model on ``sft_model_batch`` arrays.

    metrics: loss, tokens, grad_norm, lr. ``kwargs`` go to ``make_train_step``. For bf16 compute pass
    ``compute_dtype=jnp.bfloat16`` together with a ``cfg`` whose ``dtype`` is 'bfloat16'.
    """
    return make_train_step(
        qwen2vl_sft_loss(cfg, remat=remat, chunk=chunk), optimizer, schedule=schedule, weight_key="tokens", **kwargs
    )
