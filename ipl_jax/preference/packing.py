"""Prefix-packed sequences: every continuation of one prefix scored in a single forward pass (docs/method.md §7).

A row is the prefix less its last token (segment 0), then per continuation the last prefix token and the
continuation less its last token (segment i + 1). Continuation token j sits at position p + j, as after the
prefix alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import get_rope_index, pick_bucket, prepare_vision
from ipl_jax.model.text import forward_hidden, token_log_probs
from ipl_jax.model.vision import VisionInputs, slot_image_features
from ipl_jax.preference.packed_batch import (
    PAD_SEGMENT,
    PREFIX_SEGMENT,
    PackedBatch,
    PackingConfig,
    PairRef,
    PrefixGroup,
)

# ------------------------------------------------------------------------------------------------- host side


def _group_name(group: PrefixGroup, index: int) -> str:
    return group.name or f"group {index}"


def check_group(cfg: Qwen2VLConfig, group: PrefixGroup, index: int = 0) -> None:
    """Raise ValueError naming the group when it cannot be packed."""
    name = _group_name(group, index)
    prefix = np.asarray(group.prefix_ids)
    if prefix.ndim != 1 or prefix.size < 1:
        raise ValueError(f"{name}: prefix_ids must be a non-empty 1-D array, got shape {prefix.shape}")
    if prefix[-1] == cfg.image_token_id:
        raise ValueError(f"{name}: the prefix ends with an image token; a continuation must follow text")
    if not group.continuations:
        raise ValueError(f"{name}: no continuations")
    if group.scored is not None and len(group.scored) != len(group.continuations):
        raise ValueError(f"{name}: {len(group.scored)} score masks for {len(group.continuations)} continuations")
    for i, c in enumerate(group.continuations):
        c = np.asarray(c)
        if c.ndim != 1 or c.size < 1:
            raise ValueError(f"{name}: continuation {i} must be a non-empty 1-D array, got shape {c.shape}")
        if np.any(c == cfg.image_token_id):
            raise ValueError(f"{name}: continuation {i} holds an image token")
        if group.scored is not None and np.asarray(group.scored[i]).shape != c.shape:
            raise ValueError(
                f"{name}: score mask {i} has shape {np.asarray(group.scored[i]).shape}, expected {c.shape}"
            )
    if (group.pixel_values is None) != (group.image_grid_thw is None):
        raise ValueError(f"{name}: give both pixel_values and image_grid_thw, or neither")


def _row(cfg: Qwen2VLConfig, group: PrefixGroup, index: int):
    """The unpadded arrays of one packed row: ids, positions [3, n], segments, targets, score slots."""
    prefix = np.asarray(group.prefix_ids, np.int64)
    grid = None if group.image_grid_thw is None else np.asarray(group.image_grid_thw).reshape(-1, 3)
    try:
        pos, _ = get_rope_index(prefix[None], np.ones((1, prefix.size), bool), grid, cfg)
    except ValueError as e:
        raise ValueError(f"{_group_name(group, index)}: {e}") from e
    pos = pos[:, 0]  # [3, L]
    last_tok, last_pos = prefix[-1], int(pos[0, -1])
    ids, positions, segs, targets, slots = (
        [prefix[:-1]],
        [pos[:, :-1]],
        [np.zeros(prefix.size - 1)],
        [np.zeros(prefix.size - 1)],
        [np.full(prefix.size - 1, -1)],
    )
    for i, c in enumerate(group.continuations):
        c = np.asarray(c, np.int64)
        n = c.size
        ids.append(np.concatenate([[last_tok], c[:-1]]))
        positions.append(np.broadcast_to(last_pos + np.arange(n), (3, n)))
        segs.append(np.full(n, i + 1))
        targets.append(c)
        slots.append(np.where(group.scored_mask(i), i, -1))
    cat = lambda xs: np.concatenate(xs).astype(np.int32)
    return cat(ids), np.concatenate(positions, axis=1).astype(np.int32), cat(segs), cat(targets), cat(slots)


def pack_groups(
    cfg: Qwen2VLConfig,
    groups: Sequence[PrefixGroup],
    pairs: Sequence[PairRef],
    packing: PackingConfig,
    vision_rows: np.ndarray | None = None,
) -> PackedBatch:
    """One PackedBatch (numpy) from at most ``rows`` groups and ``max_pairs`` pairs, at the smallest buckets that fit;
    ``vision_rows`` (sorted; None: all): the rows whose vision leaves are built.
    """
    B, M, P = packing.rows, packing.max_continuations, packing.max_pairs
    if packing.pad_id == cfg.image_token_id:
        raise ValueError("PackingConfig.pad_id must not be the image token id")
    if not groups:
        raise ValueError("pack_groups: no groups")
    if len(groups) > B:
        raise ValueError(f"pack_groups: {len(groups)} groups do not fit {B} rows")
    if len(pairs) > P:
        raise ValueError(f"pack_groups: {len(pairs)} pairs do not fit {P} pair slots")
    for g, group in enumerate(groups):
        check_group(cfg, group, g)
        if len(group.continuations) > M:
            raise ValueError(
                f"{_group_name(group, g)}: {len(group.continuations)} continuations exceed max_continuations={M}"
            )
    rows = [_row(cfg, group, g) for g, group in enumerate(groups)]
    lengths = [len(r[0]) for r in rows]
    g_long = int(np.argmax(lengths))
    T = pick_bucket(
        lengths[g_long], packing.text_buckets, f"packed row length of {_group_name(groups[g_long], g_long)}"
    )
    input_ids = np.full((B, T), packing.pad_id, np.int32)
    positions = np.zeros((3, B, T), np.int32)
    segment_ids = np.full((B, T), PAD_SEGMENT, np.int32)
    target_ids = np.zeros((B, T), np.int32)
    score_slot = np.full((B, T), -1, np.int32)
    for b, (ids, pos, seg, tgt, slot) in enumerate(rows):
        n = ids.size
        input_ids[b, :n], positions[:, b, :n], segment_ids[b, :n], target_ids[b, :n], score_slot[b, :n] = (
            ids,
            pos,
            seg,
            tgt,
            slot,
        )

    vision = _row_vision(cfg, groups, B, packing.patch_buckets, vision_rows)

    pair_pos = np.zeros((P,), np.int32)
    pair_neg = np.zeros((P,), np.int32)
    pair_valid = np.zeros((P,), bool)
    pair_turn = np.zeros((P,), np.int32)
    for k, pr in enumerate(pairs):
        if not 0 <= pr.group < len(groups):
            raise ValueError(f"pair {k}: group {pr.group} out of range (have {len(groups)})")
        n_cont = len(groups[pr.group].continuations)
        if not (0 <= pr.pos < n_cont and 0 <= pr.neg < n_cont) or pr.pos == pr.neg:
            raise ValueError(
                f"pair {k} of {_group_name(groups[pr.group], pr.group)}: continuations "
                f"({pr.pos}, {pr.neg}) must be two different indices below {n_cont}"
            )
        pair_pos[k], pair_neg[k] = pr.group * M + pr.pos, pr.group * M + pr.neg
        pair_valid[k], pair_turn[k] = True, pr.turn
    return PackedBatch(
        input_ids=input_ids,
        positions=positions,
        segment_ids=segment_ids,
        target_ids=target_ids,
        score_slot=score_slot,
        vision=vision,
        pair_pos=pair_pos,
        pair_neg=pair_neg,
        pair_valid=pair_valid,
        pair_turn=pair_turn,
        ref_pos=np.zeros((P,), np.float32),
        ref_neg=np.zeros((P,), np.float32),
        max_continuations=M,
    )


def _row_vision(
    cfg: Qwen2VLConfig,
    groups: Sequence[PrefixGroup],
    rows: int,
    patch_buckets: Sequence[int],
    vision_rows: np.ndarray | None = None,
) -> VisionInputs | None:
    """Per-row padded patches [R, Pr, ...] of ``vision_rows`` (padding rows: segment -1), or None without images."""
    if all(g.image_grid_thw is None for g in groups):
        return None
    counts = [0 if g.image_grid_thw is None else int(np.prod(g.image_grid_thw, axis=-1).sum()) for g in groups]
    g_max = int(np.argmax(counts))
    pr = pick_bucket(counts[g_max], patch_buckets, f"patch count of {_group_name(groups[g_max], g_max)}")
    v = cfg.vision
    keep = np.arange(rows) if vision_rows is None else np.asarray(vision_rows, np.int64)
    patches = np.zeros((len(keep), pr, v.patch_dim), np.float32)
    pos_hw = np.zeros((len(keep), pr, 2), np.int32)
    segment_ids = np.full((len(keep), pr), -1, np.int32)
    for i, b in enumerate(keep.tolist()):
        if b >= len(groups) or groups[b].image_grid_thw is None:
            continue
        g = groups[b]
        try:
            one = prepare_vision(cfg, np.asarray(g.pixel_values, np.float32), g.image_grid_thw, (pr,))
        except ValueError as e:
            raise ValueError(f"{_group_name(g, b)}: {e}") from e
        patches[i], pos_hw[i], segment_ids[i] = one.patches, one.pos_hw, one.segment_ids
    return VisionInputs(patches=patches, pos_hw=pos_hw, segment_ids=segment_ids)


def pack_round(
    cfg: Qwen2VLConfig,
    groups: Sequence[PrefixGroup],
    pairs: Sequence[PairRef],
    packing: PackingConfig,
    vision_rows: np.ndarray | None = None,
) -> list[PackedBatch]:
    """All groups of a round, in order, into as few batches as the row and pair capacities allow.

    Groups without pairs are dropped; a group with more pairs than ``max_pairs`` raises ValueError.
    """
    by_group: dict[int, list[PairRef]] = {}
    for pr in pairs:
        if not 0 <= pr.group < len(groups):
            raise ValueError(f"pair {pr}: group {pr.group} out of range (have {len(groups)})")
        by_group.setdefault(pr.group, []).append(pr)
    batches: list[PackedBatch] = []
    cur_groups: list[PrefixGroup] = []
    cur_pairs: list[PairRef] = []

    def flush():
        if cur_groups:
            batches.append(pack_groups(cfg, cur_groups, cur_pairs, packing, vision_rows))
            cur_groups.clear()
            cur_pairs.clear()

    for g, group in enumerate(groups):
        mine = by_group.get(g, [])
        if not mine:
            continue
        if len(mine) > packing.max_pairs:
            raise ValueError(f"{_group_name(group, g)}: {len(mine)} pairs exceed max_pairs={packing.max_pairs}")
        if len(cur_groups) == packing.rows or len(cur_pairs) + len(mine) > packing.max_pairs:
            flush()
        local = len(cur_groups)
        cur_groups.append(group)
        cur_pairs.extend(dataclasses.replace(pr, group=local) for pr in mine)
    flush()
    return batches


def unpack_groups(groups: Sequence[PrefixGroup], pairs: Sequence[PairRef]) -> tuple[list[PrefixGroup], list[PairRef]]:
    """The unpacked layout: one group (row) per (prefix, continuation); pair ``group`` indices refer to the new list
    (pack with ``max_continuations=1``)."""
    out_groups: list[PrefixGroup] = []
    index: dict[tuple[int, int], int] = {}
    for g, group in enumerate(groups):
        for i, c in enumerate(group.continuations):
            index[(g, i)] = len(out_groups)
            scored = None if group.scored is None else (group.scored[i],)
            out_groups.append(
                dataclasses.replace(group, continuations=(c,), scored=scored, name=f"{_group_name(group, g)}/cont {i}")
            )
    return out_groups, [PairUnpacked(index[(p.group, p.pos)], index[(p.group, p.neg)], p.turn) for p in pairs]


@dataclasses.dataclass(frozen=True)
class PairUnpacked:
    """A pair whose continuations live in two different single-continuation groups (the unpacked layout)."""

    pos_group: int
    neg_group: int
    turn: int = 0


def pack_unpacked(
    cfg: Qwen2VLConfig, groups: Sequence[PrefixGroup], pairs: Sequence[PairUnpacked], packing: PackingConfig
) -> list[PackedBatch]:
    """Batches of the unpacked layout: each pair's two rows in one batch, shared rows laid out once."""
    batches: list[PackedBatch] = []
    rows: list[int] = []
    cur: list[PairUnpacked] = []

    def flush():
        if not cur:
            return
        local = {g: r for r, g in enumerate(rows)}
        gs = [groups[g] for g in rows]
        batch = pack_groups(cfg, gs, [], packing)
        M = packing.max_continuations
        pos = np.zeros_like(batch.pair_pos)
        neg = np.zeros_like(batch.pair_neg)
        valid = np.zeros_like(batch.pair_valid)
        turn = np.zeros_like(batch.pair_turn)
        for k, p in enumerate(cur):
            pos[k], neg[k], valid[k], turn[k] = local[p.pos_group] * M, local[p.neg_group] * M, True, p.turn
        batches.append(batch.replace(pair_pos=pos, pair_neg=neg, pair_valid=valid, pair_turn=turn))
        rows.clear()
        cur.clear()

    for p in pairs:
        new = [g for g in dict.fromkeys((p.pos_group, p.neg_group)) if g not in rows]
        if len(rows) + len(new) > packing.rows or len(cur) + 1 > packing.max_pairs:
            flush()
            new = list(dict.fromkeys((p.pos_group, p.neg_group)))
        if len(new) > packing.rows:
            raise ValueError(f"pack_unpacked: a pair needs {len(new)} rows but a batch has {packing.rows}")
        rows.extend(new)
        cur.append(p)
    flush()
    return batches


def stack_batches(batches: Sequence[PackedBatch]) -> PackedBatch:
    """Same-shaped batches -> one batch whose leaves carry a leading [A, ...] axis (gradient accumulation)."""
    shapes = {jax.tree.structure(b) for b in batches}
    if len(shapes) != 1:
        raise ValueError("stack_batches: batches differ in structure")
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


# ------------------------------------------------------------------------------------------------ device side


def packed_attention_mask(segment_ids: jax.Array) -> jax.Array:
    """bool[B, T, T] from int32[B, T] segment ids: causal; keys visible in the prefix (0) or the query's own
    segment; padding (-1) sees and is seen by nothing."""
    t = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))[None]
    q = segment_ids[:, :, None]
    k = segment_ids[:, None, :]
    visible = (k == PREFIX_SEGMENT) | (k == q)
    return causal & visible & (q >= 0) & (k >= 0)


def chunk_for(t: int, chunk: int) -> int:
    c = min(int(chunk), t)
    return c if t % c == 0 else t


def row_image_features(params: dict, cfg: Qwen2VLConfig, vision: VisionInputs, remat=False) -> jax.Array:
    """The vision tower row by row (one row's image is a slot): f32[B * Pr / merge, hidden] in row order, fill rows
    last. ``remat``: a ``model.layers.REMAT_POLICIES`` policy."""
    return slot_image_features(params, cfg, vision, remat)


def packed_token_logps(
    params: dict, cfg: Qwen2VLConfig, batch: PackedBatch, *, remat: bool = False, chunk: int = 128
) -> jax.Array:
    """log p(target_ids) f32[B, T] at the scored positions (``score_slot`` >= 0), 0 elsewhere. Traceable."""
    feats = None if batch.vision is None else row_image_features(params, cfg, batch.vision, remat)
    # the segment ids are the attention spec: each layer builds the mask a query chunk at a time
    segments = jnp.asarray(batch.segment_ids, jnp.int32)
    hidden = forward_hidden(params, cfg, batch.input_ids, batch.positions, segments, feats, remat=remat)
    needed = jnp.asarray(batch.score_slot) >= 0  # only the scored positions: other chunks skip the vocabulary
    return token_log_probs(params, cfg, hidden, batch.target_ids, chunk=chunk_for(batch.length, chunk), needed=needed)


def slot_one_hot(batch: PackedBatch) -> jax.Array:
    """f32[B, T, M]: 1 where the position's scored target belongs to continuation slot m."""
    m = jnp.arange(batch.max_continuations, dtype=jnp.int32)
    return (jnp.asarray(batch.score_slot)[..., None] == m).astype(jnp.float32)


def continuation_logps(
    params: dict, cfg: Qwen2VLConfig, batch: PackedBatch, *, remat: bool = False, chunk: int = 128
) -> tuple[jax.Array, jax.Array]:
    """Summed log-probs f32[B, M] of every continuation slot over its scored tokens (closing ``<|im_end|>``
    included) and their token counts f32[B, M] (0 for empty slots)."""
    logp = packed_token_logps(params, cfg, batch, remat=remat, chunk=chunk)
    onehot = slot_one_hot(batch)
    return jnp.einsum("bt,btm->bm", logp, onehot), jnp.sum(onehot, axis=1)


score_continuations = jax.jit(continuation_logps, static_argnums=(1,), static_argnames=("remat", "chunk"))
score_continuations.__doc__ = continuation_logps.__doc__


def pair_logps(cont_logps: jax.Array, cont_tokens: jax.Array, batch: PackedBatch):
    """(chosen f32[P], rejected f32[P], chosen token count f32[P]) gathered from per-slot sums [B, M]."""
    flat_lp = cont_logps.reshape(-1)
    flat_n = cont_tokens.reshape(-1)
    return flat_lp[batch.pair_pos], flat_lp[batch.pair_neg], flat_n[batch.pair_pos]
