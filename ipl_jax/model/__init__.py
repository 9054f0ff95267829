"""Qwen2-VL in JAX: pure functions over a nested-dict parameter pytree (layers stacked, run with lax.scan).

Weights: ``load_params`` / ``init_params`` / ``save_params``; inputs: ``prepare_inputs``; forward:
``forward_inputs``, ``forward``, ``forward_hidden``, ``token_log_probs``; KV cache: ``prefill``, ``extend``,
``decode_step``, ``greedy_generate``. Configs are static jit arguments (``cfg.dtype`` compute,
``cfg.param_dtype`` storage). Names are imported lazily, so reading ``config`` (the job's settings hold its
``TextConfig`` / ``VisionConfig``) loads no JAX.
"""

from ipl_jax.lazy import lazy_names

__all__, __getattr__ = lazy_names(
    __name__,
    {  # module of this package -> the names it defines
        "config": ("Qwen2VLConfig", "TextConfig", "VisionConfig"),
        "decode": (
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
        ),
        "inputs": ("ModelInputs", "get_rope_index", "pick_bucket", "prepare_inputs", "prepare_vision"),
        "params": ("count_params", "init_params", "param_layout", "param_shapes"),
        "text": (
            "attention_mask_from_spec",
            "embed_tokens",
            "forward",
            "forward_hidden",
            "forward_inputs",
            "logits_from_hidden",
            "token_log_probs",
        ),
        "vision": ("VisionInputs", "encode_images", "merged_valid"),
        "weights": ("load_params", "save_params"),
    },
)
