"""The sampler benchmark's roofline arithmetic (``python -m tools.bench_sampler_gpu``): HBM bandwidth by device
kind or measured, the bytes one decode step reads (weights, KV cache per token), and the tree's shape per turn."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.coat.tree import NUM_TURNS, num_nodes
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.sampling.config import SamplerConfig
from tools import harness

HBM_BYTES_PER_S = {"h200": 4.8e12, "h100": 3.35e12, "a100": 2.0e12, "l4": 0.3e12}  # by device kind (SXM)


def decode_weight_bytes(params: dict, cfg: Qwen2VLConfig) -> int:
    """Bytes of the weights one decode step reads: every decoder layer, the final norm and the output head (the
    embedding matrix when tied); the embedding rows gathered for the fed tokens are left out."""
    model = params["model"]
    head = model["embed_tokens"]["embedding"] if cfg.tie_word_embeddings else params["lm_head"]["kernel"]
    leaves = jax.tree.leaves(model["layers"]) + jax.tree.leaves(model["norm"]) + [head]
    return int(sum(x.size * x.dtype.itemsize for x in leaves))


def kv_bytes_per_token(cfg: Qwen2VLConfig) -> int:
    t = cfg.text
    return 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * jnp.dtype(cfg.dtype).itemsize


def turn_shapes(config: SamplerConfig, batch: int, prefix_len: int, prompt_lens) -> list[dict]:
    """Per turn t: rows (nodes of level t), cache slots, and the cache length when its decode loop starts (the
    context but its last token: prefix - 1 + every earlier turn and prompt)."""
    out, context = [], prefix_len - 1
    for t in range(1, NUM_TURNS + 1):
        if t > 1:
            context += config.max_turn_tokens[t - 2] + prompt_lens[t - 2]
        out.append(
            dict(
                rows=batch * num_nodes(config.branching, t),
                slots=config.cache_size(prefix_len, prompt_lens, upto_turn=t),
                context=context,
                budget=config.max_turn_tokens[t - 1],
            )
        )
    return out


def hbm_bandwidth_measured(nbytes: int, reps: int = 5) -> float:
    """Best bytes/s of a jitted sum over a bfloat16 array of ``nbytes`` (one streaming read)."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    best = harness.best_time(f, x, warmup=1, repeats=reps)
    del x
    return nbytes / best
