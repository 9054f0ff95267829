"""The model sections: its size, precision and resolution (``model``) and its sequence buckets (``buckets``)."""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import ClassVar

from ipl_jax.settings.base import Section, SettingsError, _one_of

if typing.TYPE_CHECKING:
    from ipl_jax.training.state import Precision


@dataclasses.dataclass(frozen=True)
class ModelSettings(Section):
    PATH: ClassVar[str] = "model"
    checkpoint: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vision_depth: int
    vision_embed_dim: int
    vision_num_heads: int
    tie_word_embeddings: bool
    dtype: str
    param_dtype: str
    attention: str
    remat: str
    min_pixels: int
    max_pixels: int

    def __post_init__(self):
        from ipl_jax.model.config import DTYPES  # see the names above
        from ipl_jax.model.layers import ATTENTION_IMPLS, REMAT_POLICIES

        for name in ("dtype", "param_dtype"):
            self.need(name, getattr(self, name) in ("auto", *DTYPES), f"unknown (valid: auto, {', '.join(DTYPES)})")
        self.need("attention", self.attention in ATTENTION_IMPLS, _one_of(ATTENTION_IMPLS))
        self.need(
            "attention",
            self.attention != "cudnn" or self.dtype in ("auto", "bfloat16", "float16"),
            f"cuDNN attention needs model.dtype bfloat16 or float16, not {self.dtype} (or use auto)",
        )
        self.need("remat", self.remat in REMAT_POLICIES, _one_of(REMAT_POLICIES))
        self.at_least("min_pixels", 1)
        self.need("max_pixels", self.max_pixels >= self.min_pixels, "must be >= model.min_pixels")

    def precision(self) -> Precision:
        """'auto' compute is the checkpoint's declared dtype (float32 for a fresh model); 'auto' storage the compute
        dtype."""
        from ipl_jax.model.config import checkpoint_dtype  # see the names above
        from ipl_jax.training.state import Precision

        compute = self.dtype
        if compute == "auto":
            has_config = self.checkpoint and os.path.isfile(os.path.join(self.checkpoint, "config.json"))
            compute = checkpoint_dtype(self.checkpoint) if has_config else "float32"
        return Precision(compute, compute if self.param_dtype == "auto" else self.param_dtype, self.remat)

    def check_platform(self, platform: str) -> None:
        """The dtypes, attention and remat policy run on ``platform``."""
        from ipl_jax.model.config import BACKEND_DTYPES, DTYPES  # see the names above
        from ipl_jax.model.layers import check_remat

        valid = ("auto", *BACKEND_DTYPES.get(platform, DTYPES))
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
    """tokens: SFT row lengths; patches: patches per screenshot; max_turn_tokens: each CoaT turn's budget (end token
    included); fixed: data over a largest bucket stops the job instead of adding a bucket."""

    PATH: ClassVar[str] = "buckets"
    tokens: tuple[int, ...]
    patches: tuple[int, ...]
    max_turn_tokens: tuple[int, int, int, int]
    fixed: bool = False

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
