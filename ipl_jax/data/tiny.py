"""Random tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL (dense and MoE) checkpoints written with transformers (needs
torch), with a tiny BPE tokenizer (``data.tiny_tokenizer``) and small pixel limits.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.tiny_tokenizer import (
    MissingDependency,
    default_corpus,
    scaffold_texts,
    train_tokenizer,
    write_tokenizer,
)
from ipl_jax.data.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
)
from ipl_jax.model.config import mrope_split

DEFAULT_VOCAB_SIZE = 1024
DEFAULT_MIN_PIXELS = 56 * 56  # 3136: at least 2x2 merged tokens
DEFAULT_MAX_PIXELS = 28 * 28 * 64  # at most 64 merged image tokens

# The smallest useful shapes: head_dim 16 (mrope 2+3+3 = 8 = head_dim/2), GQA 4:2, vision width 32.
TINY_TEXT_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1000000.0},
}
TINY_VISION_CONFIG = {
    "depth": 2,
    "embed_dim": 32,
    "num_heads": 4,
    "mlp_ratio": 2,
    "hidden_act": "quick_gelu",
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "initializer_range": 0.02,
}
# Qwen2.5-VL (``arch="qwen2_5_vl"``): its HF names (hidden_size = ViT width, out_hidden_size = merger output), the
# real 112-pixel window (4x4 merged tokens); the last block attends over the whole image (build_config_dict).
TINY_VISION25_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 4,
    "hidden_act": "silu",
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "tokens_per_second": 2,
    "initializer_range": 0.02,
}
# Qwen3-VL (``arch="qwen3_vl"``): the 2.5 names, patch 16, a 6x6 learned position grid, DeepStack from block 0 (a
# head_dim of its own, interleaved M-RoPE: build_config_dict).
TINY_VISION3_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 4,
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 36,
    "deepstack_visual_indexes": [0],
    "initializer_range": 0.02,
}
# Qwen3-VL-MoE (``arch="qwen3_vl_moe"``): Qwen3-VL with every MLP 4 experts of width 32, two per token.
TINY_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
_CLASS_PREFIX = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL", "qwen3_vl_moe": "Qwen3VLMoe"}
_HALF = (0.5, 0.5, 0.5)  # Qwen3-VL's image mean and std
ROOT_KEYS = ("tie_word_embeddings", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def _require_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise MissingDependency(
            "make-tiny needs torch and transformers (install the test extra: "
            "pip install -c constraints.txt -e '.[test]')"
        ) from e
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return torch, transformers


# ---------------------------------------------------------------------------------------------- model config


def build_config_dict(
    model_overrides: dict | None, vocab_size: int, special_ids: dict[str, int], arch: str = "qwen2_vl"
) -> dict:
    """The nested Qwen2VLConfig (Qwen2_5_VLConfig, Qwen3VLConfig) kwargs: tiny defaults updated by
    ``model_overrides`` (sub-config dicts, root keys, flat text fields); the merger output follows the text
    ``hidden_size``.
    """
    over = copy.deepcopy(model_overrides or {})
    text = copy.deepcopy(TINY_TEXT_CONFIG)
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r} (expected one of {ARCHS})")
    qwen3 = arch in ("qwen3_vl", "qwen3_vl_moe")
    qwen25 = arch == "qwen2_5_vl" or qwen3  # the ViT width named hidden_size, the merger's out_hidden_size
    vision = copy.deepcopy(TINY_VISION3_CONFIG if qwen3 else TINY_VISION25_CONFIG if qwen25 else TINY_VISION_CONFIG)
    root: dict[str, Any] = {"tie_word_embeddings": False}
    text_over = dict(over.pop("text_config", None) or {})
    vision_over = over.pop("vision_config", None) or {}
    vision.update(vision_over)
    if arch == "qwen2_5_vl" and "fullatt_block_indexes" not in vision_over:
        vision["fullatt_block_indexes"] = [vision["depth"] - 1]
    for k in ROOT_KEYS:
        if k in over:
            root[k] = over.pop(k)
    text_over.update(over)  # anything else is a text field, as in the flat layout
    if "rope_scaling" in text_over:  # the older name
        text_over.setdefault("rope_parameters", text_over.pop("rope_scaling"))
    explicit_section = "mrope_section" in (text_over.get("rope_parameters") or {})
    rope = dict(text["rope_parameters"])
    rope.update(text_over.pop("rope_parameters", None) or {})
    if "rope_theta" in text_over:
        rope["rope_theta"] = text_over.pop("rope_theta")
    if rope.get("type") == "mrope" or rope.get("rope_type") == "mrope":
        rope.pop("type", None)
        rope["rope_type"] = "default"
    if arch == "qwen3_vl_moe":
        text.update(TINY_EXPERTS)
    text.update(text_over)
    if text["hidden_size"] % text["num_attention_heads"]:
        raise ValueError(
            f"hidden_size {text['hidden_size']} not divisible by num_attention_heads {text['num_attention_heads']}"
        )
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    if not explicit_section:
        rope["mrope_section"] = list(mrope_split(head_dim))
    if sum(rope["mrope_section"]) != head_dim // 2:
        raise ValueError(f"mrope_section {rope['mrope_section']} must sum to head_dim/2 = {head_dim // 2}")
    text["rope_parameters"] = rope
    if qwen3:
        text.setdefault("head_dim", head_dim)
        rope["mrope_interleaved"] = True
    text["vocab_size"] = int(text.get("vocab_size") or vocab_size)
    n_tok = max(special_ids.values()) + 1
    if text["vocab_size"] < n_tok:
        raise ValueError(f"model vocab_size {text['vocab_size']} is smaller than the tokenizer ({n_tok} tokens)")
    text["bos_token_id"] = special_ids[ENDOFTEXT]
    text["eos_token_id"] = special_ids[IM_END]
    text["pad_token_id"] = None
    width = "hidden_size" if qwen25 else "embed_dim"  # the ViT width's name
    vision["out_hidden_size" if qwen25 else "hidden_size"] = text["hidden_size"]
    if vision[width] % vision["num_heads"]:
        raise ValueError(f"vision {width} {vision[width]} not divisible by num_heads {vision['num_heads']}")
    want = {
        "image_token_id": special_ids[IMAGE_PAD],
        "video_token_id": special_ids[VIDEO_PAD],
        "vision_start_token_id": special_ids[VISION_START],
        "vision_end_token_id": special_ids[VISION_END],
    }
    for k, v in want.items():
        if k in root and int(root[k]) != v:
            raise ValueError(f"model override {k}={root[k]} does not match the tokenizer's id {v}")
        root[k] = v
    return {"text_config": text, "vision_config": vision, **root}


# ---------------------------------------------------------------------------------------------- weights


def _randomise_and_scale(model, seed: int, scale: float | None, random_biases: bool, init_std: float) -> None:
    import torch  # the test extra (_require_torch_transformers has checked it)

    gen = torch.Generator().manual_seed(seed + 1)
    norm_types = (torch.nn.LayerNorm,)
    with torch.no_grad():
        for module in model.modules():
            is_norm = isinstance(module, norm_types) or "norm" in type(module).__name__.lower()
            for p_name, p in module.named_parameters(recurse=False):
                if is_norm:
                    if random_biases:
                        base = 1.0 if p_name == "weight" else 0.0
                        p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
                    continue
                if p_name == "bias" and random_biases:
                    p.copy_(init_std * torch.randn(p.shape, generator=gen, dtype=p.dtype))
                if scale is not None:
                    p.mul_(float(scale))


def make_tiny_checkpoint(
    out_dir: str | Path,
    model_overrides: dict | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    corpus: list[str] | None = None,
    seed: int = 0,
    scale: float | None = None,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    random_biases: bool = True,
    arch: str = "qwen2_vl",
) -> Path:
    """Write a random tiny checkpoint + tokenizer + preprocessor config to ``out_dir``; returns it (deterministic).

    ``random_biases`` (non-zero biases, non-unit norms) and ``scale`` make port bugs in biases / norms visible.
    """
    torch, transformers = _require_torch_transformers()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if corpus is not None and not list(corpus):
        raise ValueError("make_tiny_checkpoint: empty tokenizer corpus")
    texts = default_corpus() if corpus is None else scaffold_texts() + list(corpus)
    special_ids = write_tokenizer(train_tokenizer(texts, vocab_size), out)
    cfg_kwargs = build_config_dict(model_overrides, vocab_size, special_ids, arch)
    prefix = _CLASS_PREFIX[arch]
    config = getattr(transformers, prefix + "Config")(**cfg_kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, prefix + "ForConditionalGeneration")(config).to(torch.float32).eval()
    _randomise_and_scale(model, seed, scale, random_biases, cfg_kwargs["text_config"]["initializer_range"])
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=special_ids[ENDOFTEXT],
        eos_token_id=[special_ids[IM_END], special_ids[ENDOFTEXT]],
        pad_token_id=special_ids[ENDOFTEXT],
    )
    model.save_pretrained(str(out), safe_serialization=True)
    ImageProcessorConfig(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=cfg_kwargs["vision_config"]["patch_size"],
        merge_size=cfg_kwargs["vision_config"]["spatial_merge_size"],
        temporal_patch_size=cfg_kwargs["vision_config"]["temporal_patch_size"],
        **(dict(image_mean=_HALF, image_std=_HALF) if arch.startswith("qwen3_vl") else {}),
    ).save(out)
    return out
