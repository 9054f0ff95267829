"""Qwen2-VL in JAX: pure functions over a nested-dict parameter pytree (layers stacked, run with lax.scan).

Usage::

    from ipl_jax import model as M

    params, cfg = M.load_params("path/to/hf_dir")                 # or M.init_params(cfg, key)
    inputs = M.prepare_inputs(cfg, input_ids, attention_mask,      # host-side numpy: pads text and patches
                              pixel_values, image_grid_thw)        # to buckets, computes M-RoPE positions
    logits = M.forward_inputs(params, cfg, inputs)                 # f32[B, T, V]

    # The core primitive, for callers that build their own token layouts (prefix packing, SFT):
    feats = M.encode_images(params, cfg, inputs.vision)           # f32[P/4, hidden] (pad rows at the end)
    logits = M.forward(params, cfg, ids, positions, attn, feats)   # ids int32[B,T], positions int32[3,B,T]
    # attn: bool[B,T] key padding (causal) OR bool[B,T,T] explicit (True = may attend)
    hidden = M.forward_hidden(params, cfg, ids, positions, attn, feats, remat=True)
    logp = M.token_log_probs(params, cfg, hidden, targets)         # f32[B,T] without full-vocab logits at once

    # KV cache: compact per-row slots, per-row next M-RoPE position.
    last_logits, cache = M.prefill(params, cfg, inputs, cache_size=T + 64)   # f32[B, V]
    cache = M.repeat_cache(cache, k)                               # fan a prefix out to k branches: B -> B*k
    logits, cache = M.extend(params, cfg, cache, ids, valid)       # append T tokens (teacher forcing); cache donated
    logits, cache = M.decode_step(params, cfg, cache, tok, valid)  # T = 1
    # inside a caller's own jitted loop (the sampler): the same append, unjitted, cache as a loop carry
    logits, cache = M.append_tokens(params, cfg, cache, ids, valid)
    tokens, n = M.greedy_generate(params, cfg, inputs, max_new_tokens=32, eos_ids=(eos,))

    M.save_params(params, cfg, "out_dir")                          # HF safetensors + config.json

Sharding: ``M.sharding.make_mesh``, ``param_shardings(params_or_shapes, mesh)`` (regex rules over '/'-joined
paths), then ``load_params(dir, shardings=...)`` places each leaf straight into its sharding; the functions above
run unchanged on placed arrays (``inputs_shardings`` / ``cache_shardings`` place inputs and caches).
Configs are frozen dataclasses (static jit arguments); ``cfg.dtype`` is the compute dtype, ``cfg.param_dtype``
the storage dtype, ``cfg.attention_query_chunk`` bounds attention memory. All public compute functions are
jitted with ``cfg`` static (``greedy_generate`` wraps a jitted loop; its end ids are traced, not static).
"""

from ipl_jax.model.config import Qwen2VLConfig, TextConfig, VisionConfig
from ipl_jax.model.decode import (
    KVCache,
    append_tokens,
    decode_step,
    extend,
    greedy_generate,
    grow_cache,
    init_cache,
    prefill,
    repeat_cache,
    select_rows,
)
from ipl_jax.model.inputs import ModelInputs, get_rope_index, pick_bucket, prepare_inputs, prepare_vision
from ipl_jax.model.params import count_params, init_params, param_layout, param_shapes
from ipl_jax.model.text import (
    attention_mask_from_spec,
    embed_tokens,
    forward,
    forward_hidden,
    forward_inputs,
    logits_from_hidden,
    token_log_probs,
)
from ipl_jax.model.vision import VisionInputs, encode_images, merged_valid
from ipl_jax.model.weights import load_params, save_params

__all__ = [
    "Qwen2VLConfig",
    "TextConfig",
    "VisionConfig",
    "KVCache",
    "append_tokens",
    "decode_step",
    "extend",
    "greedy_generate",
    "grow_cache",
    "init_cache",
    "prefill",
    "repeat_cache",
    "select_rows",
    "ModelInputs",
    "get_rope_index",
    "pick_bucket",
    "prepare_inputs",
    "prepare_vision",
    "count_params",
    "init_params",
    "param_layout",
    "param_shapes",
    "attention_mask_from_spec",
    "embed_tokens",
    "forward",
    "forward_hidden",
    "forward_inputs",
    "logits_from_hidden",
    "token_log_probs",
    "VisionInputs",
    "encode_images",
    "merged_valid",
    "load_params",
    "save_params",
]
