"""Qwen2-VL in JAX: pure functions over a nested-dict parameter pytree (layers stacked, run with lax.scan).

Weights: ``load_params`` / ``init_params`` / ``save_params``; inputs: ``prepare_inputs``; forward:
``forward_inputs``, ``forward``, ``forward_hidden``, ``token_log_probs``; KV cache: ``prefill``, ``extend``,
``decode_step``, ``greedy_generate``. Configs are static jit arguments (``cfg.dtype`` compute,
``cfg.param_dtype`` storage).
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
