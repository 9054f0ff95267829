"""The cached decode path the sampler's loop runs (``model.decode.append_tokens`` one token at a time, inside a
jitted loop) against one teacher-forced append of the same tokens, and its two-block attention against
attention over the concatenated keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from support.trees import assert_trees_close

from ipl_jax import model as M
from ipl_jax.model.decode import append_tokens
from ipl_jax.model.layers import attention, two_block_attention


def _filled_cache(cfg, params, rows: int, size: int, seed: int):
    """A cache whose rows hold different numbers of tokens (prefilled through the model, left/right pads)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 12, rows)
    ids = np.zeros((rows, 12), np.int32)
    mask = np.zeros((rows, 12), bool)
    for r, n in enumerate(lengths):
        start = int(rng.integers(0, 12 - n + 1))
        ids[r, start : start + n] = rng.integers(10, cfg.text.vocab_size, n)
        mask[r, start : start + n] = True
    inputs = M.prepare_inputs(cfg, ids, mask, text_buckets=(16,))
    _, cache = M.prefill(params, cfg, inputs, cache_size=size)
    return cache


def test_token_by_token_appends_equal_one_teacher_forced_append(sampler_model):
    cfg, params = sampler_model
    rng = np.random.default_rng(1)
    cache = _filled_cache(cfg, params, rows=5, size=24, seed=0)

    @jax.jit
    def one_by_one(c, ids, valid):
        def body(c, xs):
            tok, ok = xs
            logits, c = append_tokens(params, cfg, c, tok[:, None], ok[:, None])
            return c, logits[:, 0]

        c, logits = jax.lax.scan(body, c, (ids.T, valid.T))
        return logits.swapaxes(0, 1), c

    @jax.jit
    def without_logits(c, ids, valid):  # a prompt extension: cache only, no lm_head
        return append_tokens(params, cfg, c, ids, valid, logits=False)

    for _ in range(2):  # two appends of 3 tokens: the second attends to the first one's entries
        ids = jnp.asarray(rng.integers(10, cfg.text.vocab_size, (5, 3)), jnp.int32)
        valid = jnp.asarray(rng.random((5, 3)) < 0.75).at[0].set(True).at[1].set(False)  # row 1 appends nothing
        with jax.default_matmul_precision("highest"):
            got_logits, got = one_by_one(cache, ids, valid)
            none, prompt_cache = without_logits(cache, ids, valid)
            want_logits, want = M.extend(params, cfg, jax.tree.map(jnp.copy, cache), ids, valid)
        v = np.asarray(valid)
        np.testing.assert_allclose(np.asarray(got_logits)[v], np.asarray(want_logits)[v], atol=2e-5, rtol=1e-5)
        np.testing.assert_array_equal(got.length, want.length)
        np.testing.assert_array_equal(got.next_pos, want.next_pos)
        assert none is None
        for c in (got, prompt_cache):  # k, v within 1e-5; length, next_pos (int32) exactly
            assert_trees_close(c, want, rtol=1e-7, atol=1e-5)
        assert int(np.sum(np.asarray(want.length) - np.asarray(cache.length))) == int(v.sum()) > 0
        cache = want


def test_two_block_attention_equals_attention_over_the_concatenation():
    rng = np.random.default_rng(0)
    r, s, hq, hkv, d = 3, 7, 4, 2, 8
    for t, chunk in ((3, 0), (3, 2), (1, 0)):  # chunked queries and the one-token (decoding) form
        q = jnp.asarray(rng.standard_normal((r, t, hq, d)), jnp.float32)
        k_old, v_old = (jnp.asarray(rng.standard_normal((r, s, hkv, d)), jnp.float32) for _ in range(2))
        k_new, v_new = (jnp.asarray(rng.standard_normal((r, t, hkv, d)), jnp.float32) for _ in range(2))
        old_mask = jnp.asarray(rng.random((r, s)) < 0.6)
        new_mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(r, 0)
        got = two_block_attention(q, k_old, v_old, old_mask, k_new, v_new, new_mask, chunk)
        mask = jnp.concatenate([jnp.broadcast_to(old_mask[:, None], (r, t, s)), new_mask], axis=2)
        want = attention(q, jnp.concatenate([k_old, k_new], 1), jnp.concatenate([v_old, v_new], 1), mask)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


def test_sample_tokens_selects_greedy_or_drawn_tokens_without_a_branch():
    """``sample_tokens`` equals its definition — argmax of the allowed logits at temperature 0, else a categorical
    draw from the filtered logits with the row's key — at every temperature, with and without top-k / top-p; the
    traced program has no branch (a per-token host sync on GPUs) unless a filter's sort is to be skipped."""
    from ipl_jax.sampling.token_sampling import filter_logits, sample_tokens

    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((6, 40)) * 3, jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 6)
    suppress = (5, 17)
    allowed = logits.at[:, jnp.asarray(suppress)].set(-jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)
    for top_k, top_p in ((0, 1.0), (4, 1.0), (0, 0.7)):
        fn = jax.jit(lambda lg, k, t, top_k=top_k, top_p=top_p: sample_tokens(lg, k, t, top_k, top_p, suppress))
        for temp in (0.0, 0.7, 1.3):
            tok, lp = fn(logits, keys, jnp.float32(temp))
            if temp == 0:
                want = jnp.argmax(allowed, axis=-1)
            else:
                want = jax.vmap(jax.random.categorical)(keys, filter_logits(allowed, temp, top_k, top_p))
            np.testing.assert_array_equal(np.asarray(tok), np.asarray(want))
            np.testing.assert_array_equal(np.asarray(lp), np.asarray(logp)[np.arange(6), np.asarray(want)])
            assert not set(np.asarray(tok).tolist()) & set(suppress)
        program = str(jax.make_jaxpr(fn)(logits, keys, jnp.float32(1.0)))  # nested jaxprs printed inline
        assert (" cond[" in program) == (top_k > 0 or top_p < 1.0), (top_k, top_p)
