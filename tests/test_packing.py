"""Prefix-packed rows: layout, attention mask, M-RoPE positions, and log-probs equal to a plain per-sequence
forward (and to the unpacked layout)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.small_models import IMG, VS, make_groups, tiny_cfg, tiny_params

from ipl_jax import model as M
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK


def direct_logps(params, cfg, group, i):
    """Sum of log p(continuation tokens) from a plain causal forward of prefix + continuation (no packing),
    right-padded to 32 tokens (key-padding mask) so that every call shares one compilation."""
    seq = np.concatenate([group.prefix_ids, group.continuations[i]]).astype(np.int32)
    inputs = M.prepare_inputs(
        cfg, seq[None], None, group.pixel_values, group.image_grid_thw, text_buckets=(32,), patch_buckets=(32,)
    )
    feats = M.encode_images(params, cfg, inputs.vision)
    logits = M.forward(params, cfg, inputs.input_ids, inputs.positions, inputs.attention_mask, feats)
    logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
    L = len(group.prefix_ids)
    c = group.continuations[i]
    picked = np.asarray(logp[L - 1 : L - 1 + len(c)])[np.arange(len(c)), c]
    return float(np.sum(picked * group.scored_mask(i)))


def test_attention_mask_known_answer():
    seg = jnp.asarray([[0, 0, 1, 1, 2, 2, 2, -1]])
    got = np.asarray(PK.packed_attention_mask(seg))[0].astype(int)
    want = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    np.testing.assert_array_equal(got, want)


def test_row_layout_and_positions_match_the_unshared_sequence():
    """Each continuation segment is [last prefix token, c[:-1]] predicting c, and its M-RoPE positions are
    those the same tokens get in the plain sequence prefix + continuation."""
    cfg = tiny_cfg()
    groups = make_groups(cfg, seed=1, n_groups=2)
    batch = PK.pack_groups(
        cfg,
        groups,
        [PB.PairRef(0, 0, 1, 2)],
        PB.PackingConfig(rows=3, max_continuations=4, max_pairs=2, text_buckets=(64,), patch_buckets=(64,)),
    )
    assert batch.input_ids.shape == (3, 64) and batch.positions.shape == (3, 3, 64)
    assert np.all(batch.segment_ids[2] == -1)  # the padding row
    for b, g in enumerate(groups):
        L = len(g.prefix_ids)
        seg = batch.segment_ids[b]
        np.testing.assert_array_equal(batch.input_ids[b, : L - 1], g.prefix_ids[:-1])
        for i, c in enumerate(g.continuations):
            where = np.flatnonzero(seg == i + 1)
            assert where.size == len(c) and np.all(np.diff(where) == 1)
            np.testing.assert_array_equal(batch.input_ids[b, where], np.concatenate([[g.prefix_ids[-1]], c[:-1]]))
            np.testing.assert_array_equal(batch.target_ids[b, where], c)
            np.testing.assert_array_equal(batch.score_slot[b, where], i)
            full = np.concatenate([g.prefix_ids, c])[None]
            pos, _ = M.get_rope_index(full, np.ones_like(full, bool), g.image_grid_thw, cfg)
            np.testing.assert_array_equal(batch.positions[:, b, where], pos[:, 0, L - 1 : L - 1 + len(c)])
        np.testing.assert_array_equal(batch.score_slot[b, : L - 1], -1)
    assert batch.pair_pos[0] == 0 * 4 + 0 and batch.pair_neg[0] == 1 and batch.pair_valid.tolist() == [True, False]
    assert batch.vision.patches.shape == (3, 64, cfg.vision.patch_dim)  # per row; row 2 has none
    for b, g in enumerate(groups):
        n = int(np.prod(g.image_grid_thw))
        np.testing.assert_array_equal(batch.vision.patches[b, :n], g.pixel_values)
        assert np.all(batch.vision.segment_ids[b, :n] == 0) and np.all(batch.vision.segment_ids[b, n:] == -1)
    assert np.all(batch.vision.segment_ids[2] == -1)


def test_packed_and_unpacked_logps_equal_direct_forward():
    """Group 1 scores only some of its continuation tokens (as the naive-DPO layout does)."""
    cfg = tiny_cfg()
    params = tiny_params(cfg)
    groups = make_groups(cfg, seed=2, scored_groups=(1,))
    pairs = [PB.PairRef(g, 0, 1, 1) for g in range(3)] + [PB.PairRef(2, 3, 1, 3)]
    packing = PB.PackingConfig(rows=4, max_continuations=4, max_pairs=8, text_buckets=(64,), patch_buckets=(32,))
    with jax.default_matmul_precision("highest"):
        (batch,) = PK.pack_round(cfg, groups, pairs, packing)
        lp, ntok = PK.score_continuations(params, cfg, batch, chunk=16)
        want = np.zeros((4, 4))
        for g, group in enumerate(groups):
            for i in range(len(group.continuations)):
                want[g, i] = direct_logps(params, cfg, group, i)
                assert float(ntok[g, i]) == group.scored_mask(i).sum()
        assert np.abs(want).max() > 1.0  # far from trivial
        np.testing.assert_allclose(np.asarray(lp), want, atol=1e-5, rtol=0)
        pos, neg, pos_n = PK.pair_logps(lp, ntok, batch)
        np.testing.assert_allclose(np.asarray(pos)[:4], [want[0, 0], want[1, 0], want[2, 0], want[2, 3]], atol=1e-5)
        np.testing.assert_allclose(np.asarray(neg)[:4], [want[0, 1], want[1, 1], want[2, 1], want[2, 1]], atol=1e-5)

        # unpacked: one row per (prefix, continuation); the same pair log-probs
        ugroups, upairs = PK.unpack_groups(groups, pairs)
        assert len(ugroups) == sum(len(g.continuations) for g in groups)
        ubatches = PK.pack_unpacked(
            cfg,
            ugroups,
            upairs,
            PB.PackingConfig(rows=4, max_continuations=1, max_pairs=8, text_buckets=(32,), patch_buckets=(32,)),
        )
        got_pos, got_neg = [], []
        for ub in ubatches:
            ulp, un = PK.score_continuations(params, cfg, ub, chunk=16)
            p, n, _ = PK.pair_logps(ulp, un, ub)
            k = int(ub.pair_valid.sum())
            got_pos += list(np.asarray(p)[:k])
            got_neg += list(np.asarray(n)[:k])
        np.testing.assert_allclose(got_pos, np.asarray(pos)[:4], atol=1e-5)
        np.testing.assert_allclose(got_neg, np.asarray(neg)[:4], atol=1e-5)


def test_pack_round_splits_by_rows_and_pairs_and_drops_pairless_groups():
    cfg = tiny_cfg()
    groups = make_groups(cfg, seed=3, n_groups=5, conts=(2,))
    pairs = [PB.PairRef(0, 0, 1), PB.PairRef(0, 1, 0), PB.PairRef(2, 0, 1), PB.PairRef(3, 0, 1), PB.PairRef(4, 1, 0)]
    packing = PB.PackingConfig(rows=2, max_continuations=2, max_pairs=3, text_buckets=(64,), patch_buckets=(32,))
    batches = PK.pack_round(cfg, groups, pairs, packing)
    # group 1 has no pair; groups (0, 2) fill rows; then (3, 4)
    assert [b.num_pairs for b in batches] == [3, 2]
    np.testing.assert_array_equal(batches[0].input_ids[1, :5], groups[2].prefix_ids[:5])
    np.testing.assert_array_equal(batches[1].pair_pos[:2], [0, 2 + 1])


def test_bad_groups_raise_naming_the_group():
    cfg = tiny_cfg()
    (g,) = make_groups(cfg, seed=4, n_groups=1)
    packing = PB.PackingConfig(rows=2, max_continuations=2, max_pairs=2, text_buckets=(64,), patch_buckets=(32,))
    with pytest.raises(ValueError, match="g0: 3 continuations exceed"):
        PK.pack_groups(cfg, [g], [], packing)
    bad = PB.PrefixGroup(prefix_ids=np.array([3, VS, IMG], np.int32), continuations=(np.array([5]),), name="img-end")
    with pytest.raises(ValueError, match="img-end: the prefix ends with an image token"):
        PK.pack_groups(cfg, [bad], [], packing)
    empty = PB.PrefixGroup(prefix_ids=np.array([3, 4], np.int32), continuations=(np.array([], np.int32),), name="e")
    with pytest.raises(ValueError, match="e: continuation 0 must be a non-empty"):
        PK.pack_groups(cfg, [empty], [], packing)
    long = PB.PrefixGroup(prefix_ids=np.arange(3, 50, dtype=np.int32), continuations=(np.arange(3, 40),), name="L")
    with pytest.raises(ValueError, match="packed row length of L"):
        PK.pack_groups(cfg, [long], [], packing)
    with pytest.raises(ValueError, match="pair 0 of g0"):
        PK.pack_groups(
            cfg,
            [g],
            [PB.PairRef(0, 1, 1)],
            PB.PackingConfig(rows=1, max_continuations=3, max_pairs=1, text_buckets=(64,), patch_buckets=(32,)),
        )
