"""Qwen2-VL configuration as frozen (hashable) dataclasses, so a config can be a static ``jax.jit`` argument.

``Qwen2VLConfig.from_hf_dict`` reads the flat Hub layout (``rope_scaling.mrope_section``, top-level
``rope_theta``) and the nested transformers-5 layout (``text_config.rope_parameters``); ``to_hf_dict`` writes
the nested one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")  # the dtypes a model computes and stores in (the job's model.dtype)
BACKEND_DTYPES = {"tpu": ("float32", "bfloat16")}  # the dtypes a backend runs (the other backends: DTYPES)
_ATTENTION = ("auto", "reference", "xla", "cudnn")  # = layers.ATTENTION_IMPLS (config imports nothing of the model)
_SIZES = {  # the sizes of each part that must be >= 1
    "text": "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads",
    "vision": "depth embed_dim mlp_ratio num_heads in_channels patch_size spatial_merge_size temporal_patch_size",
}
_ARCH_VISION_ACT = {"qwen2_vl": "quick_gelu", "qwen2_5_vl": "silu"}  # the one vision activation of each model


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """The vision tower (ViT + 2x2 patch merger). ``embed_dim`` is the ViT width, ``hidden_size`` the merger output
    (Qwen2.5-VL's HF config names them ``hidden_size`` and ``out_hidden_size``).
    """

    depth: int = 32
    embed_dim: int = 1280  # ViT width
    hidden_size: int = 3584  # merger output width = the language model's width (0: the text hidden_size)
    mlp_ratio: int = 4
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    hidden_act: str = "quick_gelu"
    rope_theta: float = 10000.0
    # Qwen2.5-VL only: SwiGLU width (0 = embed_dim * mlp_ratio), attention window in pixels (0 = none), the
    # blocks that attend over the whole image, and the video time scale (kept for a faithful export).
    intermediate_size: int = 0
    window_size: int = 0
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: int = 0

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def window_tokens(self) -> int:
        """Side of an attention window in merged tokens (4 for Qwen2.5-VL); 0 = no windows."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch: C * T * P * P (1176 for the real models)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def mlp_dim(self) -> int:
        return self.intermediate_size or int(self.embed_dim * self.mlp_ratio)

    @property
    def merge_factor(self) -> int:
        """Patches per merged (language-model) token: spatial_merge_size squared."""
        return self.spatial_merge_size * self.spatial_merge_size


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The Qwen2 decoder with multimodal (3-section) rotary positions (``mrope_section`` (): ``mrope_split``
    of head_dim, filled in by ``Qwen2VLConfig``)."""

    vocab_size: int = 152064
    hidden_size: int = 8192
    intermediate_size: int = 29568
    num_hidden_layers: int = 80
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1000000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    bos_token_id: int | None = 151643
    eos_token_id: tuple[int, ...] = (151645,)
    pad_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads


@dataclasses.dataclass(frozen=True)
class Qwen2VLConfig:
    """The whole model. ``param_dtype`` is the storage dtype of the weights, ``dtype`` the compute dtype."""

    vision: VisionConfig = VisionConfig()
    text: TextConfig = TextConfig()
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False
    # "qwen2_vl" or "qwen2_5_vl" (same decoder; 2.5 has the RMSNorm/SwiGLU windowed vision tower)
    model_type: str = "qwen2_vl"
    param_dtype: str = "float32"
    dtype: str = "float32"
    # Runtime knob (not part of the HF config): attention processes this many queries at a time when a
    # sequence (text tokens, or all packed patches in the vision tower) is longer; 0 = never chunk.
    attention_query_chunk: int = 2048
    # Runtime knob: "auto" (per backend: cuDNN on a GPU with a 16-bit dtype, else the reference), "reference"
    # (the masked softmax of model/layers.py; parity tests, CPUs), "xla" or "cudnn" (jax.nn.dot_product_attention)
    # for the forward passes without a cache (training, scoring, prefill, the vision tower).
    attention: str = "auto"

    def __post_init__(self):
        for part, names in _SIZES.items():
            for name in names.split():
                if getattr(getattr(self, part), name) < 1:
                    raise ValueError(f"{part} {name} must be >= 1, got {getattr(getattr(self, part), name)}")
        self._fill_in()
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"Qwen2VLConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.attention not in _ATTENTION:
            raise ValueError(f"attention {self.attention!r} is unknown (valid: {', '.join(_ATTENTION)})")
        if self.attention_query_chunk < 0:
            raise ValueError(f"attention_query_chunk must be >= 0, got {self.attention_query_chunk}")
        t, v = self.text, self.vision
        if t.hidden_size % t.num_attention_heads:
            raise ValueError(f"text hidden_size {t.hidden_size} is not divisible by heads {t.num_attention_heads}")
        if t.num_attention_heads % t.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {t.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {t.num_key_value_heads}"
            )
        if len(t.mrope_section) != 3:
            raise ValueError(f"mrope_section {t.mrope_section} must be 3 sizes (time, height, width)")
        if sum(t.mrope_section) * 2 != t.head_dim:
            raise ValueError(f"mrope_section {t.mrope_section} must sum to head_dim/2 = {t.head_dim // 2}")
        if t.hidden_act != "silu":
            raise ValueError(f"unsupported text hidden_act {t.hidden_act!r} (only silu)")
        if v.embed_dim % v.num_heads or v.head_dim % 4:
            raise ValueError(
                f"vision embed_dim {v.embed_dim} / heads {v.num_heads} must give a head_dim divisible by 4"
            )
        if v.hidden_size != t.hidden_size:
            raise ValueError(f"vision hidden_size {v.hidden_size} must equal the text hidden_size {t.hidden_size}")
        if self.model_type not in _ARCH_VISION_ACT:
            raise ValueError(f"model_type must be one of {tuple(_ARCH_VISION_ACT)}, got {self.model_type!r}")
        if v.hidden_act != _ARCH_VISION_ACT[self.model_type]:
            raise ValueError(
                f"unsupported vision hidden_act {v.hidden_act!r} for {self.model_type} "
                f"(only {_ARCH_VISION_ACT[self.model_type]})"
            )
        if self.model_type == "qwen2_5_vl":
            if v.window_tokens < 1:
                raise ValueError(
                    f"vision window_size {v.window_size} must be at least spatial_merge_size * "
                    f"patch_size = {v.spatial_merge_size * v.patch_size}"
                )

    def _fill_in(self) -> None:
        """The sizes left to follow the others: an empty ``text.mrope_section`` (``mrope_split``) and a
        ``vision.hidden_size`` of 0 (the text width), written in once, when made."""
        t, v = self.text, self.vision
        if not t.mrope_section:
            object.__setattr__(self, "text", dataclasses.replace(t, mrope_section=mrope_split(t.head_dim)))
        if not v.hidden_size:
            object.__setattr__(self, "vision", dataclasses.replace(v, hidden_size=t.hidden_size))

    def replace(self, **kw) -> Qwen2VLConfig:
        return dataclasses.replace(self, **kw)

    # ------------------------------------------------------------------ HF config.json I/O

    @staticmethod
    def from_hf_dict(d: dict[str, Any], **overrides) -> Qwen2VLConfig:
        """Builds a config from a Hugging Face ``config.json`` dict (flat Hub or nested v5 layout)."""
        if not isinstance(d, dict):
            raise ValueError(f"config must be a dict, got {type(d).__name__}")
        txt = d.get("text_config") or d
        vis = d.get("vision_config")
        if vis is None:
            raise ValueError("config has no 'vision_config'; not a Qwen2-VL config")
        text = _text_from_hf(d, txt)
        vision, model_type = _vision_from_hf(d, vis, text.hidden_size)
        tie = d.get("tie_word_embeddings")
        if not tie:
            tie = bool(txt.get("tie_word_embeddings", False)) or bool(tie)
        kw = dict(
            vision=vision,
            text=text,
            image_token_id=int(d.get("image_token_id", 151655)),
            video_token_id=int(d.get("video_token_id", 151656)),
            vision_start_token_id=int(d.get("vision_start_token_id", 151652)),
            vision_end_token_id=int(d.get("vision_end_token_id", 151653)),
            tie_word_embeddings=bool(tie),
            model_type=model_type,
        )
        kw.update(overrides)
        return Qwen2VLConfig(**kw)

    @staticmethod
    def from_dir(path: str | os.PathLike, **overrides) -> Qwen2VLConfig:
        """Reads ``<path>/config.json`` (or ``path`` itself when it is a file)."""
        p = os.fspath(path)
        file = os.path.join(p, "config.json") if os.path.isdir(p) else p
        try:
            with open(file) as f:
                d = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{file}: no config.json") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: not valid JSON: {e}") from None
        try:
            return Qwen2VLConfig.from_hf_dict(d, **overrides)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{file}: {e}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """The nested transformers-5 layout, loadable by transformers' ``from_pretrained``."""
        t, v = self.text, self.vision
        torch_dtype = self.param_dtype
        eos = list(t.eos_token_id)
        text = {
            "model_type": "qwen2_vl_text",
            "vocab_size": t.vocab_size,
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "hidden_act": t.hidden_act,
            "max_position_embeddings": t.max_position_embeddings,
            "rms_norm_eps": t.rms_norm_eps,
            "use_sliding_window": False,
            "sliding_window": None,
            "attention_dropout": 0.0,
            "rope_parameters": {
                "rope_type": "default",
                "mrope_section": list(t.mrope_section),
                "rope_theta": t.rope_theta,
            },
            "bos_token_id": t.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": t.pad_token_id,
            "dtype": torch_dtype,
        }
        vision = {
            "model_type": "qwen2_vl_vision",
            "depth": v.depth,
            "embed_dim": v.embed_dim,
            "hidden_size": v.hidden_size,
            "hidden_act": v.hidden_act,
            "mlp_ratio": v.mlp_ratio,
            "num_heads": v.num_heads,
            "in_channels": v.in_channels,
            "patch_size": v.patch_size,
            "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size,
            "rope_parameters": {"rope_theta": v.rope_theta, "rope_type": "axial"},
            "dtype": torch_dtype,
        }
        if self.model_type == "qwen2_5_vl":
            text["model_type"] = "qwen2_5_vl_text"
            for k in ("embed_dim", "mlp_ratio"):
                del vision[k]
            vision.update(
                model_type="qwen2_5_vl_vision",
                hidden_size=v.embed_dim,
                out_hidden_size=v.hidden_size,
                intermediate_size=v.mlp_dim,
                window_size=v.window_size,
                fullatt_block_indexes=list(v.fullatt_block_indexes),
                tokens_per_second=v.tokens_per_second,
            )
        return {
            "architectures": [
                "Qwen2_5_VLForConditionalGeneration"
                if self.model_type == "qwen2_5_vl"
                else "Qwen2VLForConditionalGeneration"
            ],
            "model_type": self.model_type,
            "text_config": text,
            "vision_config": vision,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
            "dtype": torch_dtype,
        }


def mrope_split(head_dim: int) -> tuple[int, int, int]:
    """Half the head dimension split about 1 : 1.5 : 1.5 over (time, height, width), like Qwen2-VL's 16 / 24 / 24."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return t, h, half - t - h


def backend_dtypes(platform: str) -> tuple[str, ...]:
    """The dtypes ``platform`` (a JAX backend name) runs: ``BACKEND_DTYPES``' entry, else ``DTYPES``."""
    return BACKEND_DTYPES.get(platform, DTYPES)


def checkpoint_dtype(path: str | os.PathLike) -> str:
    """The dtype a checkpoint's ``config.json`` declares (float32 / bfloat16 / float16; float32 when none)."""
    p = os.fspath(path)
    file = os.path.join(p, "config.json") if os.path.isdir(p) else p
    with open(file) as f:
        d = json.load(f)
    text = d.get("text_config") or {}
    name = d.get("torch_dtype") or d.get("dtype") or text.get("torch_dtype") or text.get("dtype") or "float32"
    name = str(name).removeprefix("torch.")
    return name if name in DTYPES else "float32"


def _model_type(d: dict[str, Any], vis: dict[str, Any]) -> str:
    """'qwen2_5_vl' when the root model_type, the architectures or the vision config say so, else 'qwen2_vl'."""
    root = d.get("model_type")
    if root not in (None, "qwen2_vl", "qwen2_5_vl"):
        raise ValueError(f"model_type {root!r} is neither qwen2_vl nor qwen2_5_vl")
    archs = d.get("architectures") or ()
    if (
        root == "qwen2_5_vl"
        or any(str(a).startswith("Qwen2_5_VL") for a in archs)
        or vis.get("model_type") in ("qwen2_5_vl", "qwen2_5_vl_vision")
    ):
        return "qwen2_5_vl"
    return "qwen2_vl"


def _text_from_hf(d: dict[str, Any], txt: dict[str, Any]) -> TextConfig:
    """The language model's settings from a ``config.json`` dict ``d`` and its text part ``txt`` (``d`` itself in
    the flat layout; rope, eos, bos and pad may sit at either level). Rejects what the decoder does not run."""
    rope = txt.get("rope_parameters") or txt.get("rope_scaling") or d.get("rope_scaling") or {}
    mrope = tuple(int(s) for s in rope.get("mrope_section", (16, 24, 24)))
    rope_theta = rope.get("rope_theta", txt.get("rope_theta", d.get("rope_theta", 1000000.0)))
    eos = txt.get("eos_token_id", d.get("eos_token_id", 151645))
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else ((int(eos),) if eos is not None else ())
    hidden = int(txt.get("hidden_size", 8192))
    heads = int(txt.get("num_attention_heads", 64))
    text = TextConfig(
        vocab_size=int(txt.get("vocab_size", 152064)),
        hidden_size=hidden,
        intermediate_size=int(txt.get("intermediate_size", 29568)),
        num_hidden_layers=int(txt.get("num_hidden_layers", 80)),
        num_attention_heads=heads,
        num_key_value_heads=int(txt.get("num_key_value_heads") or heads),
        rms_norm_eps=float(txt.get("rms_norm_eps", 1e-5)),
        rope_theta=float(rope_theta),
        mrope_section=mrope,  # type: ignore[arg-type]
        max_position_embeddings=int(txt.get("max_position_embeddings", 32768)),
        hidden_act=str(txt.get("hidden_act", "silu")),
        bos_token_id=txt.get("bos_token_id", d.get("bos_token_id")),
        eos_token_id=eos,
        pad_token_id=txt.get("pad_token_id", d.get("pad_token_id")),
    )
    if txt.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported (HF honours it only with flash attention)")
    return text


def _vision_from_hf(d: dict[str, Any], vis: dict[str, Any], text_hidden: int) -> tuple[VisionConfig, str]:
    """The vision tower's settings from the ``vision_config`` dict ``vis`` and the model type (see ``_model_type``).
    Qwen2.5-VL names its ViT width hidden_size and the merger's output out_hidden_size; Qwen2-VL's merger output
    (hidden_size) defaults to the text width ``text_hidden``. Returns (VisionConfig, model_type)."""
    vrope = vis.get("rope_parameters") or {}
    patch = vis.get("patch_size", 14)
    tpatch = vis.get("temporal_patch_size", 2)
    if isinstance(patch, (list, tuple)) or isinstance(tpatch, (list, tuple)):
        raise ValueError(f"non-scalar patch sizes are not supported: {patch!r}, {tpatch!r}")
    model_type = _model_type(d, vis)
    common = dict(
        depth=int(vis.get("depth", 32)),
        num_heads=int(vis.get("num_heads", 16)),
        in_channels=int(vis.get("in_channels", 3)),  # HF ignores the old 'in_chans' key too
        patch_size=int(patch),
        spatial_merge_size=int(vis.get("spatial_merge_size", 2)),
        temporal_patch_size=int(tpatch),
        rope_theta=float(vrope.get("rope_theta", 10000.0)),
    )
    if model_type == "qwen2_5_vl":  # HF: hidden_size = ViT width, out_hidden_size = merger output
        vision = VisionConfig(
            embed_dim=int(vis.get("hidden_size", 3584)),
            hidden_size=int(vis.get("out_hidden_size", 3584)),
            intermediate_size=int(vis.get("intermediate_size", 3420)),
            hidden_act=str(vis.get("hidden_act", "silu")),
            window_size=int(vis.get("window_size", 112)),
            fullatt_block_indexes=tuple(int(i) for i in vis.get("fullatt_block_indexes", (7, 15, 23, 31))),
            tokens_per_second=int(vis.get("tokens_per_second", 4)),
            **common,
        )
    else:
        vision = VisionConfig(
            embed_dim=int(vis.get("embed_dim", 1280)),
            hidden_size=int(vis.get("hidden_size", text_hidden)),
            mlp_ratio=int(vis.get("mlp_ratio", 4)),
            hidden_act=str(vis.get("hidden_act", "quick_gelu")),
            **common,
        )
    return vision, model_type
