"""The prefix-sharing CoaT-tree sampler on a tiny random Qwen2-VL (init_params, std 0.3).

Every test reuses one sampler configuration (branching (2, 2, 2, 1), batch 2): temperatures are traced, so the
greedy and the sampled runs share a single compilation, which ``test_three_batches_compile_once`` counts.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from support import EOS, IMAGE, VIDEO
from support.compiles import count_traces
from support.sampler_models import assert_greedy_tree_is_greedy_decoding, random_step
from support.trees import assert_trees_close, assert_trees_equal

from ipl_jax import model as M
from ipl_jax.coat.tree import NUM_TURNS, flatten_node_index, leaf_paths, unflatten_node_index
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.keys import node_keys, step_keys, step_uid
from ipl_jax.sampling.no_sharing import sample_tree_no_sharing
from ipl_jax.sampling.prompts import pack_tree_prompts
from ipl_jax.sampling.tree_sampler import sample_tree

CONFIG = SamplerConfig(
    branching=(2, 2, 2, 1),
    max_turn_tokens=(6, 5, 4, 4),
    temperature=(1.0, 1.0, 1.0, 0.0),
    eos_ids=(EOS,),
    suppress_ids=(IMAGE, VIDEO),
    prefix_buckets=(32,),
    prompt_buckets=(16,),
    patch_buckets=(64,),
)
SEED = 7
PLAN = ([0, 1], [2, 0], [3, 4])  # three batches of two steps; step 0 appears twice, at different rows
REF_BUCKET = 128  # text bucket of every reference forward / greedy run (one compilation each)
SAMPLER = "_sample_tree"  # the jitted prefix-sharing sampler's function


@pytest.fixture(scope="module")
def model(sampler_model):
    return sampler_model


@pytest.fixture(scope="module")
def steps(model):
    cfg, _ = model
    rng = np.random.default_rng(0)
    shapes = [
        (5, (7, 3, 4), (1, 4, 4)),
        (9, (9, 2, 5), (1, 4, 6)),
        (14, (12, 3, 4), (1, 4, 4)),
        (3, (5, 4, 6), (1, 4, 6)),
        (20, (16, 1, 3), (1, 4, 4)),
    ]
    return [random_step(rng, cfg, uid=100 + i, n_text=n, prompt_lens=p, grid=g) for i, (n, p, g) in enumerate(shapes)]


@pytest.fixture(scope="module")
def batches(model, steps):
    """(prompts, trees, compilations of the sampler) for the three batches of PLAN."""
    cfg, params = model
    prompts, trees = [], []
    with count_traces() as traces:
        for idx in PLAN:
            tp = pack_tree_prompts(cfg, [steps[i] for i in idx], CONFIG, SEED, step_index=idx)
            prompts.append(tp)
            trees.append(jax.device_get(sample_tree(params, cfg, tp, CONFIG)))
    return prompts, trees, traces[SAMPLER]


def _np(tree):
    return jax.tree.map(np.asarray, tree)


def node_context(step, tree, row: int, path: tuple, turn: int) -> list[int]:
    """The token context of turn ``turn`` of the node on ``path`` (its first turn-1 choices): prefix, then
    for each earlier turn its sampled tokens and the next prompt."""
    br = tree.branching
    ctx = list(step.prefix_ids)
    for u in range(1, turn):
        flat = flatten_node_index(path[:u], br)
        toks = np.asarray(tree.tokens[u - 1]).reshape(tree.batch_size, -1, tree.turn_lengths[u - 1])[row, flat]
        n = int(np.asarray(tree.lengths[u - 1]).reshape(tree.batch_size, -1)[row, flat])
        ctx += list(toks[:n]) + list(step.turn_prompt_ids[u - 1])
    return ctx


@pytest.mark.e2e
def test_three_batches_compile_once(batches):
    _, trees, compilations = batches
    assert compilations == 1
    for tr in trees:
        tr.validate()


def test_tree_arrays_are_consistent(batches):
    _, trees, _ = batches
    for tr in map(_np, trees):
        assert tr.tokens[0].shape == (2, 2, 6) and tr.tokens[3].shape == (2, 2, 2, 2, 1, 4)
        for t in range(NUM_TURNS):
            toks, n, lp, fin = tr.tokens[t], tr.lengths[t], tr.logps[t], tr.finished[t]
            T = toks.shape[-1]
            pos = np.arange(T)
            inside = pos < n[..., None]
            assert np.all(n >= 1) and np.all(n <= T)
            assert np.all(toks[~inside] == CONFIG.pad_id) and np.all(lp[~inside] == 0)
            assert np.all(lp[inside] < 0) and np.all(np.isfinite(lp))
            last = np.take_along_axis(toks, (n - 1)[..., None], axis=-1)[..., 0]
            np.testing.assert_array_equal(fin, last == EOS)
            assert np.all(n[~fin] == T)  # an unfinished turn used its whole budget
            before_last = inside & (pos < (n - 1)[..., None])
            assert not np.any(toks[before_last] == EOS)  # a turn stops at its first eos
        assert tr.step_valid.all()


def test_same_step_same_tree_in_any_batch(batches):
    _, trees, _ = batches
    a, b = _np(trees[0]), _np(trees[1])  # step 0 is row 0 of batch 0 and row 1 of batch 1
    a0, b1 = jax.tree.map(lambda x: x[0], a), jax.tree.map(lambda x: x[1], b)
    assert_trees_equal(a0.replace(logps=None), b1.replace(logps=None))
    assert_trees_close(a0.logps, b1.logps, rtol=1e-7, atol=1e-5)
    assert a.step_index.tolist() == [0, 1] and b.step_index.tolist() == [2, 0]


def test_siblings_get_different_keys(batches):
    """With one key for all siblings, every pair of sibling s1 turns would be equal."""
    _, trees, _ = batches
    differ = [not np.array_equal(tr.tokens[0][r, 0], tr.tokens[0][r, 1]) for tr in map(_np, trees) for r in range(2)]
    assert sum(differ) >= 4


def test_node_keys_fold_step_key_level_and_path():
    keys = step_keys(3, [step_uid("ep", 4), step_uid("ep", 5)])
    np.testing.assert_array_equal(keys[0], jax.random.fold_in(jax.random.PRNGKey(3), step_uid("ep", 4)))
    br = (2, 3, 2, 1)
    got = np.asarray(node_keys(keys, br, 3))
    assert got.shape == (2, 12, 2)
    for flat in (0, 5, 11):
        k = jax.random.fold_in(keys[1], 3)
        for c in unflatten_node_index(flat, br, 3):
            k = jax.random.fold_in(k, c)
        np.testing.assert_array_equal(got[1, flat], k)
    assert len({tuple(k) for k in got.reshape(-1, 2)}) == 24
    assert step_uid("ep", 4) == step_uid("ep", 4) != step_uid("ep", 5)


def test_leaf_logps_equal_a_teacher_forced_forward(model, steps, batches):
    """Every sampled token's stored log-prob is log softmax of a plain full forward over the leaf's whole
    dialogue (prefix, s1, prompt, s2, ... s4), untempered; this checks caches, positions and fan-out rows."""
    cfg, params = model
    _, trees, _ = batches
    tr = _np(trees[0])
    br = tr.branching
    seqs, spans, want = [], [], []
    for row, step_i in enumerate(PLAN[0]):
        st = steps[step_i]
        for leaf in leaf_paths(br)[::3]:  # a spread of leaves
            path = unflatten_node_index(int(leaf[-1]), br, NUM_TURNS)
            seq, marks = list(st.prefix_ids), []
            for t in range(1, NUM_TURNS + 1):
                if t > 1:
                    seq += list(st.turn_prompt_ids[t - 2])
                flat = flatten_node_index(path[:t], br)
                n = int(tr.lengths[t - 1].reshape(2, -1)[row, flat])
                toks = tr.tokens[t - 1].reshape(2, -1, tr.turn_lengths[t - 1])[row, flat][:n]
                marks.append((len(seq), toks, tr.logps[t - 1].reshape(2, -1, tr.turn_lengths[t - 1])[row, flat][:n]))
                seq += list(toks)
            seqs.append(seq)
            spans.append(marks)
            want.append(st)
    pv = np.concatenate([s.pixel_values for s in want])
    grids = np.concatenate([s.image_grid_thw for s in want])
    inputs = M.prepare_inputs(cfg, seqs, None, pv, grids, text_buckets=(REF_BUCKET,), patch_buckets=(256,))
    with jax.default_matmul_precision("highest"):
        logp = np.asarray(jax.nn.log_softmax(M.forward_inputs(params, cfg, inputs), axis=-1))
    checked = 0
    for i, marks in enumerate(spans):
        for start, toks, lps in marks:
            ref = logp[i, np.arange(start - 1, start - 1 + len(toks)), toks]
            np.testing.assert_allclose(lps, ref, atol=1e-4)
            checked += len(toks)
    assert checked > 50


def test_greedy_tree_equals_turn_by_turn_greedy_decoding(model, steps, batches):
    """Temperature 0 everywhere (same compilation): every leaf is the greedy four-turn decoding of its step,
    computed with ``greedy_generate`` turn by turn on the concatenated dialogue."""
    cfg, params = model
    greedy = CONFIG.replace(temperature=0.0)
    idx = PLAN[0]
    with count_traces() as traces:
        tr = _np(sample_tree(params, cfg, pack_tree_prompts(cfg, [steps[i] for i in idx], greedy, SEED), greedy))
    assert traces[SAMPLER] == 0
    used = [steps[i] for i in idx]
    total = assert_greedy_tree_is_greedy_decoding(params, cfg, used, CONFIG, tr, REF_BUCKET, patch_bucket=32)
    assert total > 2 * len(steps[0].prefix_ids)


@pytest.mark.e2e
def test_sharing_and_no_sharing_agree(model, steps, batches):
    """Same per-node keys: the no-sharing sampler (every node re-prefilled from scratch) draws the same
    tokens, with log-probs within 1e-4."""
    cfg, params = model
    _, trees, _ = batches
    shared = _np(trees[0])
    scratch = _np(sample_tree_no_sharing(params, cfg, [steps[i] for i in PLAN[0]], CONFIG, SEED, step_index=PLAN[0]))
    assert_trees_equal(shared.replace(logps=None), scratch.replace(logps=None))
    assert_trees_close(shared.logps, scratch.logps, rtol=1e-7, atol=1e-4)


# ------------------------------------------------------------------------------------------------- statistics

# chi-square critical values at p = 0.001 (for when scipy is missing), by degrees of freedom
_CHI2_999 = {
    1: 10.83,
    2: 13.82,
    3: 16.27,
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
    9: 27.88,
    10: 29.59,
    11: 31.26,
    12: 32.91,
    13: 34.53,
    14: 36.12,
    15: 37.70,
    16: 39.25,
    17: 40.79,
    18: 42.31,
    19: 43.82,
    20: 45.31,
}


def chi_square_rejects(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[bool, float]:
    """Pearson's test of observed ``counts`` against ``probs`` at level 0.001; categories whose expected count
    is below ``min_expected`` are pooled. Returns (rejected, statistic)."""
    n = counts.sum()
    expected = probs / probs.sum() * n
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < min_expected:  # fold a small pooled bin into the smallest kept one
        j = int(np.argmin(exp[:-1]))
        obs[j] += obs[-1]
        exp[j] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    stat = float(np.sum((obs - exp) ** 2 / exp))
    dof = len(obs) - 1
    try:
        from scipy.stats import chi2

        return bool(chi2.sf(stat, dof) < 1e-3), stat
    except ImportError:
        return stat > _CHI2_999[dof], stat


def test_first_token_frequencies_match_the_model_softmax(model, steps, batches):
    """First tokens of s1 over 150 trees per step (2 per tree; per-step keys from 150 seeds) follow
    softmax(logits / 1.5) of the model at the prefix, and are recorded with the untempered log-softmax."""
    cfg, params = model
    prompts, _, _ = batches
    tp = prompts[0]
    temp = 1.5
    config = CONFIG.replace(temperature=(temp, 1.0, 1.0, 0.0))
    firsts, first_logps = [], []
    with count_traces() as traces:
        for seed in range(150):
            keyed = tp.replace(step_keys=step_keys(seed, [steps[i].uid for i in PLAN[0]]))
            tr = sample_tree(params, cfg, keyed, config)
            firsts.append(np.asarray(tr.tokens[0][:, :, 0]))
            first_logps.append(np.asarray(tr.logps[0][:, :, 0]))
    assert traces[SAMPLER] == 0
    firsts, first_logps = np.stack(firsts), np.stack(first_logps)  # [150, B, b1]
    seqs = [list(steps[i].prefix_ids) for i in PLAN[0]]
    inputs = M.prepare_inputs(
        cfg,
        seqs,
        None,
        np.concatenate([steps[i].pixel_values for i in PLAN[0]]),
        np.concatenate([steps[i].image_grid_thw for i in PLAN[0]]),
        text_buckets=(REF_BUCKET,),
        patch_buckets=(256,),
    )
    with jax.default_matmul_precision("highest"):
        logits = np.asarray(M.forward_inputs(params, cfg, inputs), np.float64)
    for row, seq in enumerate(seqs):
        z = logits[row, len(seq) - 1]
        logp = z - np.log(np.sum(np.exp(z - z.max()))) - z.max()
        tok = firsts[:, row].ravel()
        np.testing.assert_allclose(first_logps[:, row].ravel(), logp[tok], atol=1e-4)
        counts = np.bincount(tok, minlength=len(z)).astype(float)
        tempered = np.exp((z - z.max()) / temp)
        rejected, stat = chi_square_rejects(counts, tempered)
        assert not rejected, (row, stat)
        if row == 0:  # the peaked row: the untempered softmax must be rejected (the test has power)
            assert chi_square_rejects(counts, np.exp(z - z.max()))[0]


SETTINGS = ((3, 1.0), (0, 0.6), (4, 0.8))  # (top_k, top_p)


def test_sample_tokens_top_k_top_p_frequencies():
    """Draws at temperature 0.9 follow the tempered distribution restricted to the top-k / top-p set (and
    renormalised); nothing outside the set is ever drawn; the recorded log-probs are untempered."""
    from ipl_jax.sampling.token_sampling import sample_tokens

    logits = np.log(np.array([0.30, 0.22, 0.16, 0.12, 0.08, 0.06, 0.04, 0.02], np.float32))[None]
    temp = 0.9
    n = 6000
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(1), i))(np.arange(n))
    rows = np.repeat(logits, n, 0)
    draws = jax.jit(lambda k: [sample_tokens(rows, k, temp, top_k, top_p) for top_k, top_p in SETTINGS])(keys)
    p = np.exp(logits[0] / temp)
    p /= p.sum()
    for (top_k, top_p), (toks, lps) in zip(SETTINGS, draws):
        toks = np.asarray(toks)
        np.testing.assert_allclose(np.asarray(lps), logits[0, toks], atol=1e-6)  # untempered
        keep = np.ones(8, bool)
        if top_k:
            keep[top_k:] = False
        if top_p < 1:
            q = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
            keep &= (np.cumsum(q) - q) < top_p
        assert 1 < int(keep.sum()) < 8
        counts = np.bincount(toks, minlength=8).astype(float)
        assert counts[~keep].sum() == 0
        assert not chi_square_rejects(counts[keep], p[keep])[0], (top_k, top_p)
