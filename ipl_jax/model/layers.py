"""Small numeric building blocks shared by the vision tower and the text decoder.

Numerics follow transformers' eager path (norms and softmax in float32, cast back). Attention implementations:
``reference`` (chunked masked softmax), ``xla`` / ``cudnn`` (``jax.nn.dot_product_attention``), ``auto``.
Remat policies: ``REMAT_POLICIES``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

ATTENTION_IMPLS = ("auto", "reference", "xla", "cudnn")
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_no_batch", "offload")


@functools.cache
def cudnn_unavailable() -> str | None:
    """Why cuDNN attention cannot run on the default backend (None when it can)."""
    backend = jax.default_backend()
    if backend != "gpu":
        return f"it needs a GPU, this backend is {backend}"
    try:
        x = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.bfloat16)
        jax.jit(lambda q: jax.nn.dot_product_attention(q, q, q, implementation="cudnn")).lower(x).compile()
    except Exception as e:  # any failure means the kernel is not usable here
        return f"cuDNN flash attention does not compile on this GPU ({type(e).__name__}: {str(e)[:160]})"
    return None


def cudnn_refusal(dtype, head_dims) -> str | None:
    """Why cuDNN attention cannot run this model (None when it can): needs a 16-bit dtype, head dims that are
    multiples of 8 up to ``CUDNN_MAX_HEAD_DIM``, and a backend where it compiles."""
    name = jnp.dtype(dtype).name
    if name not in CUDNN_DTYPES:
        return f"it needs a bfloat16 or float16 compute dtype, the model computes in {name}"
    bad = [d for d in head_dims if d % 8 or d > CUDNN_MAX_HEAD_DIM]
    if bad:
        return f"head dim {bad[0]} is not a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}"
    return cudnn_unavailable()


def resolve_attention(name: str, dtype, head_dims=()) -> str:
    """The implementation that runs for the setting ``name``: 'auto' is 'cudnn' where it can run, else 'reference'
    (never fails); an explicit 'cudnn' that cannot run raises ValueError."""
    if name not in ATTENTION_IMPLS:
        raise ValueError(f"model.attention={name!r} is unknown (valid: {', '.join(ATTENTION_IMPLS)})")
    if name == "auto":
        return "cudnn" if cudnn_refusal(dtype, head_dims) is None else "reference"
    if name == "cudnn":
        why = cudnn_refusal(dtype, head_dims)
        if why is not None:
            raise ValueError(f"model.attention='cudnn' cannot run: {why} (use 'auto' or 'reference')")
    return name


def remat_policy_name(remat) -> str:
    """A remat setting (bool, None or a policy name) -> a name of ``REMAT_POLICIES`` (True = 'full')."""
    if remat is None or remat is False:
        return "none"
    if remat is True:
        return "full"
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat policy {remat!r} is unknown (valid: {', '.join(REMAT_POLICIES)})")
    return remat


def check_remat(remat, platform: str, setting: str = "remat") -> str:
    """The policy name, or ValueError (one line naming ``setting``) when the platform cannot run it."""
    name = remat_policy_name(remat)
    if name == "offload":
        kinds = {m.kind for d in jax.devices(platform)[:1] for m in d.addressable_memories()}
        if "pinned_host" not in kinds:
            raise ValueError(
                f"{setting}='offload' needs a pinned_host memory space, which {platform} lacks (valid here: "
                "none, full, dots_saveable)"
            )
    return name


def remat_body(body, remat):
    """``body`` (a scan body) under ``jax.checkpoint`` with the policy ``remat`` names; 'none' returns it as is."""
    name = remat_policy_name(remat)
    if name == "none":
        return body
    if name == "full":
        return jax.checkpoint(body)
    if name == "dots_saveable":
        return jax.checkpoint(body, policy=jax.checkpoint_policies.dots_saveable)
    if name == "dots_no_batch":
        return jax.checkpoint(body, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    return jax.checkpoint(body, policy=policy)


def shard_rows(x: jnp.ndarray) -> jnp.ndarray:
    """x with its leading (row) axis split over the ambient mesh's ('data', 'fsdp') axes when the rows divide, else
    unchanged (keeps XLA from splitting the MLP's width instead)."""
    mesh = jax.sharding.get_abstract_mesh()
    names = tuple(n for n in ("data", "fsdp") if not mesh.empty and n in mesh.axis_names)
    size = 1
    for n in names:
        size *= dict(mesh.shape)[n]
    if size == 1 or x.shape[0] % size:
        return x
    spec = jax.sharding.PartitionSpec(names, *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, spec)


def dense(p: dict, x: jnp.ndarray, dtype) -> jnp.ndarray:
    """x @ kernel (+ bias). p: {'kernel': [in, out], optional 'bias': [out]}; x: [..., in] -> dtype[..., out].

    An attached LoRA adapter (``lora_a`` [in, r], ``lora_b`` [r, out], scale folded into b) is merged here:
    kernel + a @ b, in the kernel's dtype."""
    kernel = p["kernel"]
    if "lora_a" in p:
        delta = jnp.matmul(p["lora_a"], p["lora_b"], precision=jax.lax.Precision.HIGHEST)
        kernel = (kernel.astype(jnp.promote_types(kernel.dtype, delta.dtype)) + delta).astype(kernel.dtype)
    y = jnp.einsum("...i,io->...o", x.astype(dtype), kernel.astype(dtype))
    if "bias" in p:
        y = y + p["bias"].astype(dtype)
    return y


def rms_norm(p: dict, x: jnp.ndarray, eps: float) -> jnp.ndarray:
    """weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).astype(x.dtype). p: {'scale': [D]}."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return p["scale"].astype(x.dtype) * y.astype(x.dtype)


def layer_norm(p: dict, x: jnp.ndarray, eps: float) -> jnp.ndarray:
    """LayerNorm computed in float32, cast back to x.dtype. p: {'scale': [D], 'bias': [D]}."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    y = y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)
    return y.astype(x.dtype)


def quick_gelu(x: jnp.ndarray) -> jnp.ndarray:
    return x * jax.nn.sigmoid(1.702 * x)


def _attention_dense(q, k, v, mask):
    # Head-major: q, k, v (small: T x D per head) are transposed to [B, Hkv, G*T, D] / [B, Hkv, S, D] once, so
    # both products, and their gradients, are plain batched matmuls over (B, Hkv) on the score tensor's own
    # layout; contracting over (G, T) in token-major order made XLA copy the [.., T, S] scores (measured on CPU:
    # ~1.5x the forward+backward time of this function).
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qh = q.reshape(b, t, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    scores = jnp.einsum("bkqd,bksd->bkqs", qh, kh) * jnp.asarray(d**-0.5, q.dtype)
    scores = scores.reshape(b, hkv, g, t, s)
    big_neg = jnp.finfo(scores.dtype).min
    scores = jnp.where(mask[:, None, None, :, :], scores, big_neg)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype).reshape(b, hkv, g * t, s)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, vh)
    return out.reshape(b, hkv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, hq, d)


def _query_chunks(t: int, query_chunk: int) -> tuple[int, int]:
    """(n, size): the fewest equal chunks of at most ``query_chunk`` of T queries (padded queries cost full rows)."""
    n = 1 if not query_chunk or t <= query_chunk else -(-t // query_chunk)
    return n, -(-t // n)


def _split_queries(a, n: int, size: int):
    """[B, T, ...] -> [n, B, size, ...] (T padded at the end to n * size)."""
    a = jnp.pad(a, [(0, 0), (0, n * size - a.shape[1])] + [(0, 0)] * (a.ndim - 2))
    return a.reshape((a.shape[0], n, size) + a.shape[2:]).swapaxes(0, 1)


def _merge_queries(out, t: int):
    """``_split_queries``' inverse: [n, B, size, ...] -> [B, T, ...]."""
    out = out.swapaxes(0, 1)
    return out.reshape((out.shape[0], out.shape[1] * out.shape[2]) + out.shape[3:])[:, :t]


def _chunked(fn, q: jnp.ndarray, per_query, query_chunk: int) -> jnp.ndarray:
    """fn(q, per_query) on at most ``query_chunk`` queries at a time under ``lax.map`` (rematerialised). q: [B, T, ...];
    per_query: a pytree with the query axis at 1."""
    t = q.shape[1]
    n, size = _query_chunks(t, query_chunk)
    if n == 1:
        return fn(q, per_query)
    split = functools.partial(_split_queries, n=n, size=size)
    out = jax.lax.map(jax.checkpoint(lambda a: fn(a[0], a[1])), (split(q), jax.tree.map(split, per_query)))
    return _merge_queries(out, t)


def _fused_attention(q, k, v, mask_of, per_query, per_key, implementation: str, causal: bool, lengths):
    """``jax.nn.dot_product_attention`` on the whole sequence: per-row ``lengths`` (no mask array) or one
    bool[B, 1, T, S] mask, plus the causal hint. 'xla' and 'cudnn' get the same arguments."""
    if lengths is not None:
        n = jnp.asarray(lengths, jnp.int32)
        return jax.nn.dot_product_attention(
            q, k, v, query_seq_lengths=n, key_value_seq_lengths=n, implementation=implementation
        )
    mask = mask_of(per_query, per_key)[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal, implementation=implementation)


# ------------------------------------------------------------------ blocked attention with its own backward pass
#
# The reference path under differentiation: queries in chunks, each chunk's softmax statistics (row max, 1 / row
# sum) kept instead of its probabilities, and a backward pass that rebuilds a chunk's probabilities from its
# scores in one elementwise pass. Plain autodiff of a rematerialised chunk would rerun the whole forward (both
# products and the softmax) before the softmax's own backward passes. Measured on CPU (the T-DPO benchmark's 7
# screenshots of 2116 patches): the vision tower's forward + backward 12.4 s -> 8.1-9.2 s; no [T, S] tensor is
# kept from the forward for the backward.


def _heads(x, hkv):
    """[B, T, Hq, D] -> head-major [B, Hkv, G*T, D] (query head h = kv head h // G, G = Hq / Hkv)."""
    b, t, hq, d = x.shape
    return x.reshape(b, t, hkv, hq // hkv, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, hq // hkv * t, d)


def _unheads(x, t):
    """``_heads``' inverse: [B, Hkv, G*T, D] -> [B, T, Hq, D]."""
    b, hkv, gt, d = x.shape
    return x.reshape(b, hkv, gt // t, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, hkv * (gt // t), d)


def _masked_scores(qh, kh, mask, t):
    """f32[B, Hkv, G*T, S]: scaled scores, masked entries at the dtype's minimum (a fully masked row stays finite)."""
    b, hkv, gt, d = qh.shape
    scores = jnp.einsum("bkqd,bksd->bkqs", qh, kh) * jnp.asarray(d**-0.5, qh.dtype)
    scores = scores.reshape(b, hkv, gt // t, t, -1)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(scores.dtype).min)
    return scores.astype(jnp.float32).reshape(b, hkv, gt, -1)


def _chunk_forward(q, k, v, mask):
    """One query chunk: (out [B, T, Hq, D], (row max, 1 / row sum) each f32[B, Hkv, G*T, 1])."""
    hkv, t = k.shape[2], q.shape[1]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    scores = _masked_scores(_heads(q, hkv), kh, mask, t)
    top = jnp.max(scores, axis=-1, keepdims=True)
    inv_sum = 1.0 / jnp.sum(jnp.exp(scores - top), axis=-1, keepdims=True)
    probs = (jnp.exp(scores - top) * inv_sum).astype(q.dtype)
    return _unheads(jnp.einsum("bkqs,bksd->bkqd", probs, vh), t), (top, inv_sum)


def _chunk_backward(q, k, v, mask, out, stats, d_out):
    """Gradients (dq [B, T, Hq, D], dk, dv f32[B, S, Hkv, D]) of one query chunk from its saved statistics."""
    hkv, t, d = k.shape[2], q.shape[1], q.shape[3]
    kh, vh, qh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), _heads(q, hkv)
    d_oh = _heads(d_out.astype(q.dtype), hkv)
    top, inv_sum = stats
    # the probabilities as the forward multiplied them (compute dtype): one [c, S] tensor serves both products
    probs = (jnp.exp(_masked_scores(qh, kh, mask, t) - top) * inv_sum).astype(q.dtype)
    dv = jnp.einsum("bkqs,bkqd->bksd", probs, d_oh, preferred_element_type=jnp.float32)
    d_probs = jnp.einsum("bkqd,bksd->bkqs", d_oh, vh).astype(jnp.float32)
    # softmax backward: sum_s p_s * dp_s = d_out . out, a [G*T] vector instead of a pass over the scores
    row = jnp.sum(d_oh.astype(jnp.float32) * _heads(out, hkv).astype(jnp.float32), axis=-1, keepdims=True)
    # masked keys: their probability is exactly 0 already, unless the query has no allowed key at all (a pad,
    # uniform probabilities), whose scores the mask cuts off from every gradient: a per-query flag, not the mask
    attends = top > jnp.finfo(q.dtype).min / 2
    d_scores = jnp.where(attends, probs.astype(jnp.float32) * (d_probs - row), 0.0)
    d_scores = (d_scores * d**-0.5).astype(q.dtype)
    dq = _unheads(jnp.einsum("bkqs,bksd->bkqd", d_scores, kh), t)
    dk = jnp.einsum("bkqs,bkqd->bksd", d_scores, qh, preferred_element_type=jnp.float32)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)


def _blocked_primal(mask_of, q, k, v, per_query, per_key):
    # under an enclosing remat, a chunk's mask (integers only) would count as known and be computed ahead for every
    # chunk and kept, [n, B, H, c, S] booleans: the checkpoint keeps it inside its chunk
    chunk = jax.checkpoint(lambda a: _chunk_forward(a[0], k, v, mask_of(a[1], per_key)))
    out, stats = jax.lax.map(chunk, (q, per_query))
    return out, (q, k, v, per_query, per_key, out, stats)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked(mask_of, q, k, v, per_query, per_key):
    """q: [n, B, c, Hq, D] (n query chunks); per_query: pytree of [n, B, c, ...]; -> out [n, B, c, Hq, D]."""
    return _blocked_primal(mask_of, q, k, v, per_query, per_key)[0]


def _blocked_bwd(mask_of, saved, d_out):
    q, k, v, per_query, per_key, out, stats = saved

    def chunk(acc, xs):
        qc, pc, oc, sc, dc = xs
        dq, dk, dv = _chunk_backward(qc, k, v, mask_of(pc, per_key), oc, sc, dc)
        return (acc[0] + dk, acc[1] + dv), dq

    zeros = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    (dk, dv), dq = jax.lax.scan(chunk, zeros, (q, per_query, out, stats, d_out))
    no_grad = lambda x: None  # the mask inputs (integers / booleans) get no gradient
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), jax.tree.map(no_grad, per_query), jax.tree.map(no_grad, per_key)


_blocked.defvjp(_blocked_primal, _blocked_bwd)


def _blocked_attention(q, k, v, mask_of, per_query, per_key, query_chunk: int):
    n, size = _query_chunks(q.shape[1], query_chunk)
    split = functools.partial(_split_queries, n=n, size=size)
    out = _blocked(mask_of, split(q), k, v, jax.tree.map(split, per_query), per_key)
    return _merge_queries(out, q.shape[1])


def masked_attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    mask_of,
    per_query,
    per_key=None,
    query_chunk: int = 0,
    implementation: str = "reference",
    *,
    causal: bool = False,
    lengths: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """Attention whose mask is built per query chunk by ``mask_of(per_query_chunk, per_key) -> bool[B, c, S]``.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D]; ``per_query``: pytree of [B, T, ...]; ``mask_of`` reads only its
    arguments. Optional hints (same result): ``causal``; ``lengths`` int32[B] (mask = first ``lengths`` tokens)."""
    dims = {q.shape[-1], v.shape[-1]}
    implementation = resolve_attention(implementation, q.dtype, tuple(dims))
    if implementation == "reference":
        return _blocked_attention(q, k, v, mask_of, per_query, per_key, query_chunk)
    return _fused_attention(q, k, v, mask_of, per_query, per_key, implementation, causal, lengths)


def attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray, query_chunk: int = 0) -> jnp.ndarray:
    """Masked softmax attention with grouped key/value heads: q [B, T, Hq, D], k, v [B, S, Hkv, D], mask
    bool[B, T, S] -> [B, T, Hq, D] in q's dtype. A fully masked row gives a finite average, not NaN.
    """
    return _chunked(lambda qc, mc: _attention_dense(qc, k, v, mc), q, mask, query_chunk)


def segment_attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    q_segments: jnp.ndarray,
    k_segments: jnp.ndarray,
    query_chunk: int = 0,
    implementation: str = "reference",
    lengths: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """Block-diagonal attention: query t attends key s iff their segment ids are equal.

    q_segments: int32[B, T], k_segments: int32[B, S]. ``lengths`` int32[B]: hint that each row is one segment of
    that many tokens followed by padding."""
    return masked_attention(q, k, v, same_segment, q_segments, k_segments, query_chunk, implementation, lengths=lengths)


def same_segment(q_segments, k_segments):
    return q_segments[:, :, None] == k_segments[:, None, :]


def _two_block_dense(q, k_old, v_old, old_mask, k_new, v_new, new_mask):
    r, t, hq, d = q.shape
    hkv = k_new.shape[2]
    qg = q.reshape(r, t, hkv, hq // hkv, d)
    scale = jnp.asarray(d**-0.5, q.dtype)
    if t == 1:  # one new token (decoding): multiply-and-reduce reads the cache in its stored layout, no transpose
        s_old = jnp.sum(qg[:, 0, None, :, :, :] * k_old.astype(q.dtype)[:, :, :, None, :], axis=-1)  # [R,S,k,g]
        s_old = jnp.transpose(s_old, (0, 2, 3, 1))[:, :, :, None, :] * scale  # [R, k, g, 1, S]
    else:
        s_old = jnp.einsum("btkgd,bskd->bkgts", qg, k_old.astype(q.dtype)) * scale
    s_new = jnp.einsum("btkgd,bskd->bkgts", qg, k_new) * scale
    big_neg = jnp.finfo(s_old.dtype).min
    s_old = jnp.where(old_mask[:, None, None, None, :], s_old, big_neg)
    s_new = jnp.where(new_mask[:, None, None, :, :], s_new, big_neg)
    probs = jax.nn.softmax(jnp.concatenate([s_old, s_new], axis=-1).astype(jnp.float32), axis=-1).astype(q.dtype)
    s = k_old.shape[1]
    if t == 1:
        p_old = jnp.transpose(probs[:, :, :, 0, :s], (0, 3, 1, 2))  # [R, S, k, g]
        o_old = jnp.sum(p_old[..., None] * v_old.astype(q.dtype)[:, :, :, None, :], axis=1)[:, None]  # [R,1,k,g,D]
    else:
        o_old = jnp.einsum("bkgts,bskd->btkgd", probs[..., :s], v_old.astype(q.dtype))
    out = o_old + jnp.einsum("bkgts,bskd->btkgd", probs[..., s:], v_new)
    return out.reshape(r, t, hq, d)


def two_block_attention(
    q: jnp.ndarray,
    k_old: jnp.ndarray,
    v_old: jnp.ndarray,
    old_mask: jnp.ndarray,
    k_new: jnp.ndarray,
    v_new: jnp.ndarray,
    new_mask: jnp.ndarray,
    query_chunk: int = 0,
) -> jnp.ndarray:
    """``attention`` over a KV cache and the new tokens with one joint softmax, without copying the cache.

    q: [R, T, Hq, D]; k_old, v_old: [R, S, Hkv, D]; old_mask: bool[R, S]; k_new, v_new: [R, T, Hkv, D];
    new_mask: bool[R, T, T] -> [R, T, Hq, D].
    """
    return _chunked(
        lambda qc, mc: _two_block_dense(qc, k_old, v_old, old_mask, k_new, v_new, mc), q, new_mask, query_chunk
    )
