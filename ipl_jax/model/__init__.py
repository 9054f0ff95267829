"""Qwen2-VL in JAX: pure functions over a nested-dict parameter pytree (layers stacked, run with lax.scan).

Weights: ``load_params`` / ``init_params`` / ``save_params``; inputs: ``prepare_inputs``; forward:
``forward_inputs``, ``forward``, ``forward_hidden``, ``token_log_probs``; KV cache: ``prefill``, ``extend``,
``decode_step``, ``greedy_generate``. Configs are static jit arguments (``cfg.dtype`` compute,
``cfg.param_dtype`` storage). Names are imported lazily, so reading ``config`` (the job's settings hold its
``TextConfig`` / ``VisionConfig``) loads no JAX.
"""

import importlib

_MODULES = {  # name -> the module of this package that defines it
    "Qwen2VLConfig": "config",
    "TextConfig": "config",
    "VisionConfig": "config",
    "KVCache": "decode",
    "append_tokens": "decode",
    "decode_step": "decode",
    "extend": "decode",
    "greedy_generate": "decode",
    "grow_cache": "decode",
    "init_cache": "decode",
    "prefill": "decode",
    "repeat_cache": "decode",
    "select_rows": "decode",
    "ModelInputs": "inputs",
    "get_rope_index": "inputs",
    "pick_bucket": "inputs",
    "prepare_inputs": "inputs",
    "prepare_vision": "inputs",
    "count_params": "params",
    "init_params": "params",
    "param_layout": "params",
    "param_shapes": "params",
    "attention_mask_from_spec": "text",
    "embed_tokens": "text",
    "forward": "text",
    "forward_hidden": "text",
    "forward_inputs": "text",
    "logits_from_hidden": "text",
    "token_log_probs": "text",
    "VisionInputs": "vision",
    "encode_images": "vision",
    "merged_valid": "vision",
    "load_params": "weights",
    "save_params": "weights",
}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
