"""KV cache, prefill, extension (teacher-forced segments or single decode steps) and greedy generation.

Compact cache: row b holds its valid tokens in slots ``0 .. length[b]-1`` (keys rotated, pads never written);
``next_pos[b]`` is the next text position. Tokens past the cache size are dropped (``length`` saturates).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import struct

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import ModelInputs
from ipl_jax.model.layers import two_block_attention
from ipl_jax.model.text import decoder_stack, deepstack_embeds, embed_tokens, logits_from_hidden, self_attention
from ipl_jax.model.vision import encode_images_unjitted


@struct.dataclass
class KVCache:
    """k, v: dtype[L, B, S, Hkv, D]; length: int32[B] (valid slots = write index); next_pos: int32[B]."""

    k: jnp.ndarray
    v: jnp.ndarray
    length: jnp.ndarray
    next_pos: jnp.ndarray

    @property
    def size(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]


def init_cache(cfg: Qwen2VLConfig, batch: int, size: int) -> KVCache:
    """An empty cache of ``size`` slots per row, in the compute dtype."""
    t = cfg.text
    shape = (t.num_hidden_layers, batch, size, t.num_key_value_heads, t.head_dim)
    z = jnp.zeros(shape, jnp.dtype(cfg.dtype))
    return KVCache(k=z, v=z, length=jnp.zeros((batch,), jnp.int32), next_pos=jnp.zeros((batch,), jnp.int32))


def repeat_cache(cache: KVCache, k: int) -> KVCache:
    """Each row repeated k times contiguously: rows [a, b] -> [a, a, .., b, b, ..] (B -> B*k)."""
    return KVCache(
        k=jnp.repeat(cache.k, k, axis=1),
        v=jnp.repeat(cache.v, k, axis=1),
        length=jnp.repeat(cache.length, k),
        next_pos=jnp.repeat(cache.next_pos, k),
    )


def select_rows(cache: KVCache, idx: jnp.ndarray) -> KVCache:
    """Rows ``idx`` (int32[B']) of the cache, in that order (duplicates allowed)."""
    return KVCache(
        k=jnp.take(cache.k, idx, axis=1),
        v=jnp.take(cache.v, idx, axis=1),
        length=jnp.take(cache.length, idx),
        next_pos=jnp.take(cache.next_pos, idx),
    )


def grow_cache(cache: KVCache, size: int) -> KVCache:
    """The same cache with ``size`` slots per row (the new slots empty). size >= cache.size."""
    extra = int(size) - cache.size
    if extra < 0:
        raise ValueError(f"grow_cache: cannot shrink a cache of {cache.size} slots to {size}")
    if extra == 0:
        return cache
    pad = ((0, 0), (0, 0), (0, extra), (0, 0), (0, 0))
    return cache.replace(k=jnp.pad(cache.k, pad), v=jnp.pad(cache.v, pad))


def last_valid_index(valid: jnp.ndarray) -> jnp.ndarray:
    """int32[B]: index of the last True in each row of bool[B, T] (0 when none)."""
    t = valid.shape[1]
    idx = jnp.where(valid, jnp.arange(t)[None, :], -1)
    return jnp.maximum(jnp.max(idx, axis=1), 0).astype(jnp.int32)


def _layer(a: jnp.ndarray, layer) -> jnp.ndarray:
    # read inside the layer scan, so that XLA fuses the slice into its readers instead of copying the cache
    return jax.lax.dynamic_index_in_dim(a, layer, 0, keepdims=False)


def _run_and_write(
    params, cfg: Qwen2VLConfig, cache: KVCache, x, positions, new_mask, valid, read_cache: bool, deepstack=None
):
    """The decoder over x dtype[B, T, hidden] (new tokens attend by new_mask bool[B, T, T], and to valid cache slots
    with ``read_cache``; ``deepstack``: ``text.deepstack_embeds``), then one scatter of the valid keys / values.
    Returns (hidden, cache; next_pos unchanged)."""
    s = cache.size
    chunk = cfg.attention_query_chunk
    if read_cache:
        old_mask = jnp.arange(s)[None, :] < cache.length[:, None]  # [B, S]

        def attend(q, k, v, layer):
            return two_block_attention(
                q, _layer(cache.k, layer), _layer(cache.v, layer), old_mask, k, v, new_mask, chunk
            )
    else:
        attend = self_attention(cfg, new_mask)
    hidden, (k_new, v_new) = decoder_stack(
        params, cfg, x, positions, attend, kv_dtype=cache.k.dtype, deepstack=deepstack
    )
    b, t = valid.shape
    rank = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
    slots = jnp.where(valid, cache.length[:, None] + rank, s)  # slot s (out of range) drops a pad
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    n_new = jnp.sum(valid.astype(jnp.int32), axis=1)
    return hidden, cache.replace(
        k=cache.k.at[:, rows, slots].set(k_new, mode="drop"),
        v=cache.v.at[:, rows, slots].set(v_new, mode="drop"),
        length=jnp.minimum(cache.length + n_new, s),
    )


def _prefill(params, cfg: Qwen2VLConfig, inputs: ModelInputs, cache_size: int, all_logits: bool):
    feats = None if inputs.vision is None else encode_images_unjitted(params, cfg, inputs.vision)
    ids = jnp.asarray(inputs.input_ids)
    valid = jnp.asarray(inputs.attention_mask).astype(bool)
    b, t = ids.shape
    x = embed_tokens(params, cfg, ids, feats)
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
    cache = init_cache(cfg, b, cache_size)
    deepstack = deepstack_embeds(cfg, ids, feats)
    hidden, cache = _run_and_write(
        params, cfg, cache, x, jnp.asarray(inputs.positions), mask, valid, read_cache=False, deepstack=deepstack
    )
    n = jnp.sum(valid.astype(jnp.int32), axis=1)
    cache = cache.replace(next_pos=n + jnp.asarray(inputs.rope_deltas).astype(jnp.int32))
    if all_logits:
        return logits_from_hidden(params, cfg, hidden), cache
    last = jnp.take_along_axis(hidden, last_valid_index(valid)[:, None, None], axis=1)[:, 0]
    return logits_from_hidden(params, cfg, last), cache


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("cache_size", "all_logits"))
def prefill(params: dict, cfg: Qwen2VLConfig, inputs: ModelInputs, cache_size: int, all_logits: bool = False):
    """Encodes the images and the prompt, and fills a fresh cache of ``cache_size`` slots per row.

    inputs: ModelInputs with input_ids int32[B, T] (any padding). Returns (logits, cache): logits f32[B, V] at
    each row's last valid token, or f32[B, T, V] with ``all_logits``.
    """
    return _prefill(params, cfg, inputs, cache_size, all_logits)


def append_tokens(
    params: dict,
    cfg: Qwen2VLConfig,
    cache: KVCache,
    input_ids: jnp.ndarray,
    valid_mask: jnp.ndarray,
    positions: jnp.ndarray | None = None,
    attention_mask: jnp.ndarray | None = None,
    image_features: jnp.ndarray | None = None,
    logits: bool = True,
):
    """Appends T tokens per row to the cache; returns (logits f32[B, T, V], new cache).

    input_ids: int32[B, T]; valid_mask: bool[B, T] (pads not written); positions: int32[3, B, T] or None (text
    positions from ``next_pos``); attention_mask: bool[B, T, T] or None (causal); image_features: f32[N, hidden].
    ``logits=False`` skips the lm_head and returns (None, cache). Unjitted, for callers tracing their own loop (the
    cache then updates in place as a loop carry); ``extend`` is the jitted form that donates the cache.
    """
    ids = jnp.asarray(input_ids)
    valid = jnp.asarray(valid_mask).astype(bool)
    b, t = ids.shape
    n_new = jnp.sum(valid.astype(jnp.int32), axis=1)
    if positions is None:
        rank = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
        pos = jnp.where(valid, cache.next_pos[:, None] + rank, 0)
        positions = jnp.broadcast_to(pos[None], (3, b, t))
        next_pos = cache.next_pos + n_new
    else:
        positions = jnp.asarray(positions)
        top = jnp.max(jnp.where(valid[None], positions, -1), axis=(0, 2)) + 1
        next_pos = jnp.maximum(cache.next_pos, top)
    if attention_mask is None:
        new_mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
    else:
        new_mask = jnp.asarray(attention_mask).astype(bool) & valid[:, None, :]
    x = embed_tokens(params, cfg, ids, image_features)
    deepstack = deepstack_embeds(cfg, ids, image_features)
    hidden, cache = _run_and_write(params, cfg, cache, x, positions, new_mask, valid, True, deepstack)
    cache = cache.replace(next_pos=next_pos)
    return (logits_from_hidden(params, cfg, hidden) if logits else None), cache


extend = jax.jit(append_tokens, static_argnums=(1,), static_argnames=("logits",), donate_argnums=(2,))


@functools.partial(jax.jit, static_argnums=(1,), donate_argnums=(2,))
def decode_step(params: dict, cfg: Qwen2VLConfig, cache: KVCache, tokens: jnp.ndarray, valid: jnp.ndarray):
    """One token per row: tokens int32[B], valid bool[B] -> (logits f32[B, V], new cache)."""
    logits, cache = append_tokens(params, cfg, cache, tokens[:, None], valid[:, None])
    return logits[:, 0], cache


MAX_EOS_IDS = 8


def _greedy(
    params, cfg: Qwen2VLConfig, inputs: ModelInputs, eos: jnp.ndarray, pad_id: jnp.ndarray, max_new_tokens: int
):
    t = inputs.input_ids.shape[1]
    logits, cache = _prefill(params, cfg, inputs, t + max_new_tokens, False)
    b = logits.shape[0]
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    done = jnp.isin(tok, eos)
    out = jnp.full((b, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(tok)
    count = jnp.ones((b,), jnp.int32)

    def cond(state):
        i, _, _, done, _, _ = state
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(state):
        i, tok, cache, done, out, count = state
        logits, cache = append_tokens(params, cfg, cache, tok[:, None], ~done[:, None])
        nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        nxt = jnp.where(done, pad_id, nxt)
        out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, i))
        count = count + (~done).astype(jnp.int32)
        done = done | jnp.isin(nxt, eos)
        return i + 1, nxt, cache, done, out, count

    state = (jnp.int32(1), tok, cache, done, out, count)
    _, _, _, _, out, count = jax.lax.while_loop(cond, body, state)
    return out, count


greedy_generate_jit = jax.jit(_greedy, static_argnums=(1,), static_argnames=("max_new_tokens",))


def greedy_generate(
    params: dict,
    cfg: Qwen2VLConfig,
    inputs: ModelInputs,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    pad_id: int | None = None,
):
    """Greedy decoding: prefill, then cached steps in a jitted ``lax.while_loop`` (end / pad ids traced).

    Returns (tokens int32[B, max_new_tokens], num_tokens int32[B]). A row stops after its first token in
    ``eos_ids`` (at most 8; kept); later entries are ``pad_id`` (default: the first end id, else 0).
    """
    eos_ids = [int(e) for e in eos_ids]
    if len(eos_ids) > MAX_EOS_IDS:
        raise ValueError(f"at most {MAX_EOS_IDS} end ids, got {len(eos_ids)}")
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    eos = jnp.asarray(eos_ids + [-1] * (MAX_EOS_IDS - len(eos_ids)), jnp.int32)
    return greedy_generate_jit(params, cfg, inputs, eos, jnp.int32(pad_id), max_new_tokens=max_new_tokens)
