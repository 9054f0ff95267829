"""KV-cache decoding: greedy generation against transformers' generate, cache extension (teacher-forced
segments with pads, fan-out, packed continuations) against plain forwards."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from support.hf_models import hf_greedy, left_pad, random_image, sample_tokens, save_tiny

from ipl_jax.model.decode import decode_step, extend, greedy_generate, prefill, repeat_cache, select_rows
from ipl_jax.model.inputs import prepare_inputs
from ipl_jax.model.text import forward, forward_inputs
from ipl_jax.model.vision import encode_images
from ipl_jax.model.weights import load_params

PATCH_DIM = 3 * 2 * 14 * 14
TOL = 1e-4
pytestmark = pytest.mark.usefixtures("highest_precision")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model_dir, hf_model = save_tiny(tmp_path_factory.mktemp("decode"), seed=3, heads=4, kv_heads=2)
    params, cfg = load_params(model_dir)
    return params, cfg, hf_model


def _full_logits(params, cfg, rows, pv=None, grids=None):
    """Reference: plain forward over each full (unpadded) sequence; returns list of f32[len_i, V].
    Always a batch of 4 rows (text-only filler rows) and the same buckets, so it compiles once."""
    filler = [[11, 12, 13]] * (4 - len(rows))
    inputs = prepare_inputs(cfg, list(rows) + filler, None, pv, grids, text_buckets=(64,), patch_buckets=(128,))
    out = np.asarray(forward_inputs(params, cfg, inputs))
    return [out[i, : len(r)] for i, r in enumerate(rows)]


def test_greedy_matches_transformers_generate(tiny):
    params, cfg, hf_model = tiny
    rng = np.random.default_rng(0)
    pa, ga = random_image(rng, (4, 6), PATCH_DIM)
    pb, gb = random_image(rng, (6, 4), PATCH_DIM)
    rows = [sample_tokens(rng, 6, [ga], 4, 1000), sample_tokens(rng, 2, [gb], 3, 1000)]
    ids, mask = left_pad(rows)
    pv, grids = np.concatenate([pa, pb]), [ga, gb]
    ref = hf_greedy(hf_model, ids, mask, pv, grids, max_new_tokens=32)
    assert ref.shape == (2, 32)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(48,), patch_buckets=(64,))
    tokens, n = greedy_generate(params, cfg, inputs, max_new_tokens=32, eos_ids=())
    np.testing.assert_array_equal(np.asarray(tokens), ref)
    assert np.asarray(n).tolist() == [32, 32]

    # Stopping: make row 0's 6th token the end token; row 0 ends there and is padded, row 1 is unaffected
    # unless it emits that token too.
    eos = int(ref[0, 5])
    first0 = int(np.argmax(ref[0] == eos))
    tokens, n = greedy_generate(params, cfg, inputs, max_new_tokens=32, eos_ids=(eos,), pad_id=0)
    tokens = np.asarray(tokens)
    np.testing.assert_array_equal(tokens[0, : first0 + 1], ref[0, : first0 + 1])
    assert np.all(tokens[0, first0 + 1 :] == 0) and int(n[0]) == first0 + 1
    hits1 = np.flatnonzero(ref[1] == eos)
    stop1 = int(hits1[0]) + 1 if hits1.size else 32
    np.testing.assert_array_equal(tokens[1, :stop1], ref[1, :stop1])


@pytest.mark.e2e
def test_extend_segments_with_pads_and_fanout_match_forward(tiny):
    params, cfg, _ = tiny
    rng = np.random.default_rng(1)
    pa, ga = random_image(rng, (4, 6), PATCH_DIM)
    prompts = [sample_tokens(rng, 4, [ga], 2, 1000), list(rng.integers(10, 1000, 5))]
    seg1 = [list(rng.integers(10, 1000, 3)), list(rng.integers(10, 1000, 1))]
    ids, mask = left_pad(prompts)
    inputs = prepare_inputs(cfg, ids, mask, pa, [ga], text_buckets=(32,), patch_buckets=(64,))
    last, cache = prefill(params, cfg, inputs, cache_size=48)

    # Segment with pads in different places per row: row 0 [a, pad, b, c], row 1 [pad, pad, d, pad].
    seg_ids = np.array([[seg1[0][0], 0, seg1[0][1], seg1[0][2]], [0, 0, seg1[1][0], 0]], np.int32)
    seg_valid = np.array([[1, 0, 1, 1], [0, 0, 1, 0]], bool)
    seg_logits, cache = extend(params, cfg, cache, jnp.asarray(seg_ids), jnp.asarray(seg_valid))
    step_tok = np.array([21, 22], np.int32)
    step_logits, cache = decode_step(params, cfg, cache, jnp.asarray(step_tok), jnp.ones(2, bool))

    full = [prompts[i] + seg1[i] + [int(step_tok[i])] for i in range(2)]
    ref = _full_logits(params, cfg, full, pa, [ga])
    for i in range(2):
        n0 = len(prompts[i])
        np.testing.assert_allclose(np.asarray(last)[i], ref[i][n0 - 1], atol=TOL, rtol=0)
        got = np.asarray(seg_logits)[i][seg_valid[i]]
        np.testing.assert_allclose(got, ref[i][n0 : n0 + len(seg1[i])], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(step_logits)[i], ref[i][-1], atol=TOL, rtol=0)
    assert np.asarray(cache.length).tolist() == [len(f) for f in full]

    # Fan out: each row to 2 branches, different continuations per branch, then reorder rows.
    fan = repeat_cache(cache, 2)  # rows: 0, 0, 1, 1
    branch_tok = np.array([[31, 32], [33, 34], [35, 36], [37, 38]], np.int32)
    fan_logits, fan = extend(params, cfg, fan, jnp.asarray(branch_tok), jnp.ones((4, 2), bool))
    branch_full = [full[r // 2] + list(branch_tok[r]) for r in range(4)]
    ref_b = _full_logits(params, cfg, branch_full, np.concatenate([pa, pa]), [ga, ga])
    for r in range(4):
        np.testing.assert_allclose(np.asarray(fan_logits)[r], ref_b[r][-2:], atol=TOL, rtol=0)
    picked = select_rows(fan, jnp.asarray([3, 0]))
    nxt, _ = decode_step(params, cfg, picked, jnp.asarray([41, 42], jnp.int32), jnp.ones(2, bool))
    ref_p = _full_logits(params, cfg, [branch_full[3] + [41], branch_full[0] + [42]], pa, [ga])
    np.testing.assert_allclose(np.asarray(nxt)[0], ref_p[0][-1], atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(nxt)[1], ref_p[1][-1], atol=TOL, rtol=0)


def _packed_layout(prefix_len, cont_lens, next_pos):
    """Positions (text rows equal) and the block mask of continuations packed after one prefix."""
    t = sum(cont_lens)
    mask = np.zeros((t, t), bool)
    pos = np.zeros((t,), np.int32)
    start = 0
    for n in cont_lens:
        mask[start : start + n, start : start + n] = np.tril(np.ones((n, n), bool))
        pos[start : start + n] = next_pos + np.arange(n)
        start += n
    return pos, mask


@pytest.mark.e2e
def test_packed_continuations_match_separate_forwards(tiny):
    params, cfg, _ = tiny
    rng = np.random.default_rng(2)
    pa, ga = random_image(rng, (6, 4), PATCH_DIM)
    prefix = sample_tokens(rng, 3, [ga], 2, 1000)
    conts = [list(rng.integers(10, 1000, n)) for n in (5, 3, 7)]
    ref = _full_logits(params, cfg, [prefix + c for c in conts], np.concatenate([pa] * 3), [ga] * 3)
    p = len(prefix)
    lens = [len(c) for c in conts]

    # 1) With the cache: prefill the prefix once, extend by all continuations under a block mask.
    inputs = prepare_inputs(cfg, [prefix], None, pa, [ga], text_buckets=(16,), patch_buckets=(64,))
    _, cache = prefill(params, cfg, inputs, cache_size=40)
    next_pos = int(cache.next_pos[0])
    pos, block = _packed_layout(p, lens, next_pos)
    t_pad = 16
    ids = np.zeros((1, t_pad), np.int32)
    ids[0, : sum(lens)] = np.concatenate(conts)
    valid = np.zeros((1, t_pad), bool)
    valid[0, : sum(lens)] = True
    positions = np.zeros((3, 1, t_pad), np.int32)
    positions[:, 0, : sum(lens)] = pos
    m = np.zeros((1, t_pad, t_pad), bool)
    m[0, : sum(lens), : sum(lens)] = block
    logits, _ = extend(
        params,
        cfg,
        cache,
        jnp.asarray(ids),
        jnp.asarray(valid),
        positions=jnp.asarray(positions),
        attention_mask=jnp.asarray(m),
    )
    logits = np.asarray(logits)[0]
    start = 0
    for i, n in enumerate(lens):
        np.testing.assert_allclose(logits[start : start + n], ref[i][p : p + n], atol=TOL, rtol=0)
        start += n

    # 2) Without a cache: one forward over [prefix | c1 | c2 | c3] with an explicit bool[B, T, T] mask.
    total = p + sum(lens)
    full_ids = np.zeros((1, 32), np.int32)
    full_ids[0, :total] = np.concatenate([prefix] + conts)
    full_pos = np.zeros((3, 1, 32), np.int32)
    full_pos[:, :, :p] = inputs.positions[:, :, :p]
    full_pos[:, 0, p:total] = pos
    full_mask = np.zeros((1, 32, 32), bool)
    full_mask[0, :p, :p] = np.tril(np.ones((p, p), bool))
    full_mask[0, p:total, :p] = True
    full_mask[0, p:total, p:total] = block
    feats = encode_images(params, cfg, inputs.vision)
    packed = np.asarray(
        forward(params, cfg, jnp.asarray(full_ids), jnp.asarray(full_pos), jnp.asarray(full_mask), feats)
    )[0]
    np.testing.assert_allclose(packed[:p], ref[0][:p], atol=TOL, rtol=0)
    start = p
    for i, n in enumerate(lens):
        np.testing.assert_allclose(packed[start : start + n], ref[i][p : p + n], atol=TOL, rtol=0)
        start += n
