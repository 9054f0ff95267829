"""The decode-loop pieces shared by both tree samplers: feed, then sample, so every token enters the cache
exactly once and no logits are computed for prompts. Same per-node keys, so equal logits give equal trees.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.decode import KVCache, append_tokens, grow_cache, last_valid_index, prefill, repeat_cache
from ipl_jax.model.inputs import ModelInputs
from ipl_jax.model.sharding import batch_spec, cache_shardings
from ipl_jax.sampling.keys import position_keys
from ipl_jax.sampling.token_sampling import sample_tokens


def fan_out(cache: KVCache, feed: jax.Array, k: int, size: int):
    """Each row's cache (grown to ``size``) and pending feed repeated k times contiguously (R -> R*k)."""
    cache = grow_cache(cache, size)
    if k == 1:
        return cache, feed
    return repeat_cache(cache, k), jnp.repeat(feed, k, axis=0)


def prefill_context(params: dict, cfg: Qwen2VLConfig, inputs: ModelInputs, cache_size: int):
    """Prefills every valid token of ``inputs`` but each row's last (text) one; returns (cache, feed int32[R])."""
    mask = jnp.asarray(inputs.attention_mask).astype(bool)
    last = last_valid_index(mask)
    ids = jnp.asarray(inputs.input_ids)
    feed = jnp.take_along_axis(ids, last[:, None], axis=1)[:, 0]
    head = mask & (jnp.arange(mask.shape[1])[None, :] != last[:, None])
    _, cache = prefill(params, cfg, inputs.replace(attention_mask=head), cache_size=cache_size)
    return cache, feed


def extend_prompt(
    params: dict,
    cfg: Qwen2VLConfig,
    cache: KVCache,
    pending: jax.Array,
    pending_valid: jax.Array,
    prompt_ids: jax.Array,
    prompt_lengths: jax.Array,
):
    """Writes each row's pending token and its prompt but the last token; returns (cache, feed int32[R]).

    pending: int32[R]; pending_valid: bool[R]; prompt_ids: int32[R, Q] right-padded; prompt_lengths: int32[R] >= 1.
    """
    q = prompt_ids.shape[1]
    ids = jnp.concatenate([pending[:, None], prompt_ids], axis=1)
    valid = jnp.concatenate([pending_valid[:, None], jnp.arange(q)[None, :] < (prompt_lengths[:, None] - 1)], axis=1)
    _, cache = append_tokens(params, cfg, cache, ids, valid, logits=False)
    feed = jnp.take_along_axis(prompt_ids, jnp.maximum(prompt_lengths - 1, 0)[:, None], axis=1)[:, 0]
    return cache, feed


def sample_turn(
    params: dict,
    cfg: Qwen2VLConfig,
    cache: KVCache,
    feed: jax.Array,
    keys: jax.Array,
    budget: int,
    temperature,
    top_k: int,
    top_p: float,
    eos_ids: tuple,
    pad_id: int,
    early_exit: bool = True,
    suppress_ids: tuple = (),
):
    """One turn per row: at most ``budget`` tokens, stopping after the first eos (kept); token i uses
    ``fold_in(key, i)``. Returns (tokens int32[R, budget], lengths, logps (untempered), finished, cache, pending).
    """
    r = feed.shape[0]
    eos = jnp.asarray(eos_ids, jnp.int32)
    state0 = (
        jnp.int32(0),
        feed,
        jnp.ones((r,), bool),
        cache,
        jnp.zeros((r,), bool),
        jnp.zeros((r,), jnp.int32),
        jnp.full((r, budget), pad_id, jnp.int32),
        jnp.zeros((r, budget), jnp.float32),
    )

    def cond(state):
        i, _, _, _, done, _, _, _ = state
        go = i < budget
        return (go & ~jnp.all(done)) if early_exit else go

    def body(state):
        i, feed, feed_valid, cache, done, n, tokens, logps = state
        logits, cache = append_tokens(params, cfg, cache, feed[:, None], feed_valid[:, None])
        tok, lp = sample_tokens(logits[:, 0], position_keys(keys, i), temperature, top_k, top_p, suppress_ids)
        active = ~done
        tok = jnp.where(active, tok, pad_id)
        lp = jnp.where(active, lp, 0.0)
        tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, i))
        logps = jax.lax.dynamic_update_slice(logps, lp[:, None], (0, i))
        n = n + active.astype(jnp.int32)
        done = done | (active & jnp.isin(tok, eos))
        return i + 1, tok, active, cache, done, n, tokens, logps

    _, _, pending, cache, done, n, tokens, logps = jax.lax.while_loop(cond, body, state0)
    return tokens, n, logps, done, cache, pending


def sample_config_turn(params: dict, cfg: Qwen2VLConfig, cache: KVCache, feed, keys, budget: int, temperature, config):
    """``sample_turn`` with a ``SamplerConfig``'s token rules (top-k / top-p, eos / pad, early exit, suppression)."""
    return sample_turn(
        params,
        cfg,
        cache,
        feed,
        keys,
        budget,
        temperature,
        config.top_k,
        config.top_p,
        config.eos_ids,
        config.pad_id,
        config.early_exit,
        config.suppress_ids,
    )


def last_tokens(tokens: jax.Array, lengths: jax.Array, pad_id: int) -> jax.Array:
    """int32[R]: each row's last valid token (pad_id for empty rows)."""
    tok = jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
    return jnp.where(lengths > 0, tok, pad_id)


def constrain_rows(x, mesh: jax.sharding.Mesh | None, cfg: Qwen2VLConfig | None = None):
    """Under a mesh, pin the row (batch) axis of a cache / row array to ('data', 'fsdp'); identity otherwise."""
    if mesh is None:
        return x
    if isinstance(x, KVCache):
        return jax.lax.with_sharding_constraint(x, cache_shardings(cfg, mesh, x.batch, x.size))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, batch_spec(mesh, x.shape)))
