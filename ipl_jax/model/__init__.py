"""Qwen2-VL in JAX: pure functions over a nested-dict parameter pytree (layers stacked, run with lax.scan).

Entry points: ``load_params`` / ``init_params`` / ``save_params`` (HF safetensors); ``prepare_inputs`` (host-side
padding, M-RoPE positions) then ``forward_inputs`` -> f32[B, T, V]; ``encode_images``, ``forward``,
``forward_hidden`` and ``token_log_probs`` for callers building their own layouts; the KV cache API ``prefill``,
``repeat_cache``, ``extend``, ``decode_step``, ``append_tokens`` (unjitted) and ``greedy_generate``. Sharding
lives in ``model.sharding``. Configs are frozen dataclasses passed as static jit arguments: ``cfg.dtype`` is the
compute dtype, ``cfg.param_dtype`` the storage dtype.
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
