"""The model sections: a fresh model's shape (the model config's own ``TextConfig`` / ``VisionConfig``), precision and
resolution (``model``) and its sequence buckets (``buckets``)."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from ipl_jax.model.config import (  # the model's config loads no JAX
    DTYPES,
    Qwen2VLConfig,
    TextConfig,
    VisionConfig,
    backend_dtypes,
    checkpoint_dtype,
)
from ipl_jax.model.hf_config import MOE
from ipl_jax.model.sizes import SpecialIds, top_ids
from ipl_jax.sections import Section, SettingsError, one_of, setting_error

if typing.TYPE_CHECKING:
    from ipl_jax.data.image_processing import ImageProcessorConfig
    from ipl_jax.training.state import Precision

BUILTIN = "builtin:"  # model.checkpoint prefix naming a base model shipped inside the package
# A fresh model's shape: a 4 x 128 decoder and a 2 x 64 vision tower. Left empty, for the model config to fill in:
# the rotary sections (split from head_dim), the merger's output (the decoder's width) and the special tokens (the
# tokenizer's, ``ModelSettings.fresh_config``).
FRESH_TEXT = TextConfig(
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    mrope_section=(),
    max_position_embeddings=4096,
    bos_token_id=None,
    eos_token_id=(),
    pad_token_id=None,
)
FRESH_VISION = VisionConfig(depth=2, embed_dim=64, hidden_size=0, mlp_ratio=2, num_heads=4)
# A fresh model's architecture (model.family): a checkpoint's model_type (hf_config.FAMILIES and MOE)
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", MOE)
# What a fresh model of another family takes in place of the Qwen2-VL values above, in each field the config leaves
# at that value: Qwen2.5-VL's SwiGLU tower with 112-pixel windows (its last block attending over the whole image);
# Qwen3-VL's decoder (q/k norms, no biases, interleaved M-RoPE) and tower (patch 16, GELU-tanh, a learned 8 x 8
# position grid, DeepStack from up to three blocks before the last); Qwen3-VL-MoE's the same with every MLP 4
# experts of a quarter of the dense width, two per token (as many weights as the dense MLP, half of them per token).
_QUARTER = FRESH_TEXT.intermediate_size // 4  # an MoE expert's width
_QWEN3_TEXT = dict(qk_norm=True, qkv_bias=False, o_bias=False, mrope_interleaved=True)
FAMILY_TEXT = {
    "qwen3_vl": _QWEN3_TEXT,
    MOE: dict(_QWEN3_TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=_QUARTER),
}
FAMILY_VISION = {
    "qwen2_5_vl": lambda depth: dict(
        hidden_act="silu", window_size=112, fullatt_block_indexes=(depth - 1,), tokens_per_second=2
    ),
    "qwen3_vl": lambda depth: dict(
        hidden_act="gelu_pytorch_tanh",
        patch_size=16,
        num_position_embeddings=64,
        deepstack_visual_indexes=tuple(range(min(3, depth - 1))) or (0,),
    ),
}
FAMILY_VISION[MOE] = FAMILY_VISION["qwen3_vl"]
_TOKENIZER_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")  # a fresh model's are its tokenizer's


@dataclasses.dataclass(frozen=True)
class ModelSettings(Section):
    PATH: ClassVar[str] = "model"
    checkpoint: str = ""
    """A Hugging Face directory to start from, or a base model shipped with the package by name ('builtin:reader':
    the screen reader ``ipl-jax pretrain`` made, docs/pretrain.md); empty: a fresh model of the shape below."""
    text: TextConfig = dataclasses.field(default_factory=lambda: FRESH_TEXT)
    """A fresh model's decoder: model/config.py's TextConfig, every field (vocab_size: a BPE trained on the world's
    own texts, at most this size; mrope_section (): split from head_dim; the token ids: the tokenizer's, left empty)."""
    vision: VisionConfig = dataclasses.field(default_factory=lambda: FRESH_VISION)
    """A fresh model's vision tower: model/config.py's VisionConfig, every field (hidden_size 0: the decoder's)."""
    tie_word_embeddings: bool = True
    """A fresh model's output projection shares the input embedding (Qwen2VLConfig.tie_word_embeddings)."""
    family: str = "qwen2_vl"
    """A fresh model's architecture: qwen2_vl | qwen2_5_vl | qwen3_vl | qwen3_vl_moe (the family's own values,
    FAMILY_TEXT / FAMILY_VISION, fill the text / vision fields left at their defaults; qwen3_vl_moe is qwen3_vl with
    experts, text.num_experts ...); a checkpoint's is its config.json's model_type."""
    dtype: str = "auto"
    """Compute dtype; auto: the starting checkpoint's torch_dtype, float32 for a fresh model."""
    param_dtype: str = "auto"
    """Storage dtype of the untrained weights (sampler, evaluator, frozen reference and base); auto:
    `dtype`. Trained weights and optimizer moments are always float32."""
    attention: str = "auto"
    """auto (per backend) | reference | xla | cudnn (jax.nn.dot_product_attention)."""
    moe_dispatch: str = "auto"
    """How a sparse (MoE) MLP reaches its experts: auto (ragged on TPU, else grouped) | grouped (sorted by expert,
    blocked matmuls) | ragged (jax.lax.ragged_dot) | dense (every expert on every token); all exact."""
    remat: str = "none"
    """Training: none | full | dots_saveable | dots_no_batch | offload."""
    min_pixels: int = 112 * 224
    """Screenshot pixels, at least: the world's 224x448 seen at half size (32 image tokens after the
    2x2 merge) keeps the vision tower cheap on a CPU."""
    max_pixels: int = 112 * 224
    """Screenshot pixels, at most."""

    def __post_init__(self):
        from ipl_jax.model.experts import DISPATCHES as MOE_DISPATCHES
        from ipl_jax.model.layers import ATTENTION_IMPLS, REMAT_POLICIES

        for name in ("dtype", "param_dtype"):
            self.need(name, getattr(self, name) in ("auto", *DTYPES), f"unknown (valid: auto, {', '.join(DTYPES)})")
        self.need("attention", self.attention in ATTENTION_IMPLS, one_of(ATTENTION_IMPLS))
        self.need(
            "attention",
            self.attention != "cudnn" or self.dtype in ("auto", "bfloat16", "float16"),
            f"cuDNN attention needs model.dtype bfloat16 or float16, not {self.dtype} (or use auto)",
        )
        self.need("moe_dispatch", self.moe_dispatch in MOE_DISPATCHES, one_of(MOE_DISPATCHES))
        self.need("remat", self.remat in REMAT_POLICIES, one_of(REMAT_POLICIES))
        self.need("family", self.family in FAMILIES, one_of(FAMILIES))
        self.at_least("min_pixels", 1)
        self.need("max_pixels", self.max_pixels >= self.min_pixels, "must be >= model.min_pixels")
        self._check_shape()

    def _check_shape(self) -> None:
        """The fresh model's shape makes a model config; its token ids are left to the tokenizer, its screenshots
        are RGB."""
        for name in _TOKENIZER_IDS:
            value = getattr(self.text, name)
            if value not in (None, ()):
                raise setting_error(
                    f"model.text.{name}", value, "a fresh model's token ids are its tokenizer's: leave it none"
                )
        if self.vision.in_channels != 3:
            raise setting_error("model.vision.in_channels", self.vision.in_channels, "screenshots are RGB: must be 3")
        try:
            self.fresh_config()
        except ValueError as e:
            raise SettingsError(f"config.model.text / config.model.vision (a fresh model's shape): {e}") from None

    def fresh_config(self, special_ids: Mapping[str, int] | None = None) -> Qwen2VLConfig:
        """The model config of a fresh model: ``text`` / ``vision`` with the special tokens' ids (``special_ids``:
        token -> id, as ``write_tokenizer`` returns them; None: at the top of the vocabulary, ``top_ids``, for the
        plan, which has no tokenizer)."""
        from ipl_jax.data.tokenizer import ENDOFTEXT, IM_END, IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START

        v = self.text.vocab_size
        if special_ids is None:
            ids, bos = top_ids(v), v - 7
        else:
            tokens = (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END, IM_END)
            ids, bos = SpecialIds(*(special_ids[t] for t in tokens)), special_ids[ENDOFTEXT]
        if max(*ids, bos) >= v:
            raise ValueError(f"model vocab_size {v} is smaller than the tokenizer ({max(*ids, bos) + 1} tokens)")
        text, vision = self.family_shape()
        return Qwen2VLConfig(
            vision=vision,
            text=dataclasses.replace(text, bos_token_id=bos, eos_token_id=(ids.eos,)),
            tie_word_embeddings=self.tie_word_embeddings,
            model_type="qwen3_vl" if self.family == MOE else self.family,  # the experts are text fields
            **ids.config_fields(),
        )

    def family_shape(self) -> tuple[TextConfig, VisionConfig]:
        """``text`` / ``vision`` with ``family``'s own values in the fields left at their defaults (``FRESH_TEXT`` /
        ``FRESH_VISION``'s)."""
        text_own = FAMILY_TEXT.get(self.family, {})
        vision_own = FAMILY_VISION[self.family](self.vision.depth) if self.family in FAMILY_VISION else {}
        parts = []
        for part, fresh, own in ((self.text, FRESH_TEXT, text_own), (self.vision, FRESH_VISION, vision_own)):
            left = {k: v for k, v in own.items() if getattr(part, k) == getattr(fresh, k)}
            parts.append(dataclasses.replace(part, **left))
        return parts[0], parts[1]

    def checkpoint_dir(self) -> str:
        """``checkpoint`` as a directory ("" for none): a shipped base (``builtin:NAME``) is
        ``ipl_jax/checkpoints/NAME`` of the installed package."""
        if not self.checkpoint.startswith(BUILTIN):
            return self.checkpoint
        return str(Path(__file__).resolve().parents[1] / "checkpoints" / self.checkpoint[len(BUILTIN) :])

    def resolved(self, default_dtype: str = "float32") -> ModelSettings:
        """These settings with ``dtype`` and ``param_dtype`` concrete (the one place 'auto' is read): 'auto' compute
        is the checkpoint's declared dtype (its config.json, read here), ``default_dtype`` without a checkpoint on
        disk (float32: a fresh model; the plan passes a published architecture's); 'auto' storage the compute dtype."""
        compute = self.dtype
        if compute == "auto":
            ckpt = self.checkpoint_dir()
            has_config = ckpt and os.path.isfile(os.path.join(ckpt, "config.json"))
            compute = checkpoint_dtype(ckpt) if has_config else default_dtype
        storage = compute if self.param_dtype == "auto" else self.param_dtype
        return dataclasses.replace(self, dtype=compute, param_dtype=storage)

    def precision(self) -> Precision:
        """The job's precision, reading no file: the settings' dtypes once ``resolved``; unresolved 'auto' is float32
        for a fresh model and a SettingsError with a checkpoint."""
        from ipl_jax.training.state import Precision  # imported when made (no JAX on import)

        if self.dtype == "auto" and self.checkpoint:
            raise SettingsError(
                "config.model.dtype='auto': not resolved against config.model.checkpoint (the job's entry resolves it "
                "once: Settings.resolved)"
            )
        compute = "float32" if self.dtype == "auto" else self.dtype
        return Precision(compute, compute if self.param_dtype == "auto" else self.param_dtype, self.remat)

    def image_processor(self, model: ImageProcessorConfig | None = None) -> ImageProcessorConfig:
        """How screenshots are resized: between ``min_pixels`` and ``max_pixels``, into the patches of ``model``
        (the processor of the model the job starts from: a checkpoint's own; None: the fresh model's,
        ``ImageProcessorConfig.for_model``)."""
        from ipl_jax.data.image_processing import ImageProcessorConfig  # imported when built (no JAX on import)

        base = model or ImageProcessorConfig.for_model(self.fresh_config())
        return dataclasses.replace(base, min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def check_platform(self, platform: str) -> None:
        """The dtypes, attention and remat policy run on ``platform``."""
        from ipl_jax.model.layers import check_remat

        valid = ("auto", *backend_dtypes(platform))
        for name in ("dtype", "param_dtype"):
            self.need(name, getattr(self, name) in valid, f"not available on {platform} (valid: {', '.join(valid)})")
        self.need(
            "attention",
            self.attention != "cudnn" or platform == "gpu",
            f"cuDNN attention needs a GPU, this backend is {platform} (valid here: auto, reference, xla)",
        )
        try:
            check_remat(self.remat, platform, "config.model.remat")
        except ValueError as e:
            raise SettingsError(f"{e} (fix it with --config.model.remat=...)") from None


@dataclasses.dataclass(frozen=True)
class BucketSettings(Section):
    """The fixed shapes the programs compile for: each length a batch is padded up to."""

    PATH: ClassVar[str] = "buckets"
    tokens: tuple[int, ...] = (192, 256, 320, 384)
    """SFT row lengths."""
    patches: tuple[int, ...] = (128,)
    """Patches per screenshot (a batch of B images uses B x these)."""
    max_turn_tokens: tuple[int, int, int, int] = (64, 36, 10, 22)
    """Tokens per CoaT turn, end token included: description, thought, action, grounding (about
    the longest golden turns of the synthetic data; a box is ~20 tokens: one per digit)."""
    fixed: bool = False
    """A length over a largest bucket (measured before training) stops the job instead of adding a
    bucket for it (the `buckets` stage)."""

    def __post_init__(self):
        for name in ("tokens", "patches", "max_turn_tokens"):
            values = getattr(self, name)
            self.need(name, bool(values) and min(values) >= 1, "must be one or more sizes >= 1")

    @property
    def image_patches(self) -> int:
        """One screenshot's patch slot: the largest patch bucket."""
        return max(self.patches)

    def patch_buckets(self, images: int) -> tuple[int, ...]:
        """Patch buckets of a batch of ``images`` screenshots (the per-image buckets x images)."""
        return tuple(p * images for p in self.patches)
