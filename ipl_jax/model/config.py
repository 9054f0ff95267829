"""The model configuration of the three families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; ``model_type``) as frozen
(hashable) dataclasses, so a config can be a static ``jax.jit`` argument. One dataclass pair holds every family:
their differences are fields and switches.

``Qwen2VLConfig.from_hf_dict`` reads the flat Hub layout (``rope_scaling.mrope_section``, top-level
``rope_theta``) and the nested transformers-5 layout (``text_config.rope_parameters``); ``to_hf_dict`` writes
the nested one (the field mapping of each family: ``hf_config``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ipl_jax.model import hf_config

DTYPES = ("float32", "bfloat16", "float16")  # the dtypes a model computes and stores in (the job's model.dtype)
BACKEND_DTYPES = {"tpu": ("float32", "bfloat16")}  # the dtypes a backend runs (the other backends: DTYPES)
_ATTENTION = ("auto", "reference", "xla", "cudnn")  # = layers.ATTENTION_IMPLS (config imports nothing of the model)
_MOE_DISPATCH = ("auto", "dense", "grouped", "ragged")  # = experts.DISPATCHES
_SIZES = {  # the sizes of each part that must be >= 1
    "text": "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads",
    "vision": "depth embed_dim mlp_ratio num_heads in_channels patch_size spatial_merge_size temporal_patch_size",
}
# the one vision activation of each model
_ARCH_VISION_ACT = {"qwen2_vl": "quick_gelu", "qwen2_5_vl": "silu", "qwen3_vl": "gelu_pytorch_tanh"}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """The vision tower (ViT + 2x2 patch merger). ``embed_dim`` is the ViT width, ``hidden_size`` the merger output
    (Qwen2.5-VL's and Qwen3-VL's HF configs name them ``hidden_size`` and ``out_hidden_size``).
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
    # Qwen3-VL only: the learned position table (a square grid of this many entries, resampled to each image; 0 =
    # none) and the blocks whose outputs, each through its own merger, are added to the first decoder layers.
    num_position_embeddings: int = 0
    deepstack_visual_indexes: tuple[int, ...] = ()

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def position_grid_side(self) -> int:
        """Side of the learned position grid (transformers' ``int(num_position_embeddings ** 0.5)``)."""
        return int(self.num_position_embeddings**0.5)

    @property
    def deepstack_taps(self) -> tuple[tuple[int, int], ...]:
        """(block, merger) of each DeepStack feature in the order the decoder adds them: blocks ascending, each
        once, read by the merger at its first place in ``deepstack_visual_indexes`` (as transformers)."""
        idx = self.deepstack_visual_indexes
        return tuple((block, idx.index(block)) for block in sorted(set(idx)))

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
    """The Qwen2 / Qwen3 decoder with multimodal (3-section) rotary positions (``mrope_section`` (): ``mrope_split``
    of head_dim; ``head_dim`` 0: hidden_size / num_attention_heads; both filled in by ``Qwen2VLConfig``)."""

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
    head_dim: int = 0
    # Qwen3's attention: RMSNorm over each head's queries and keys before the rotary, its bias switch
    # (attention_bias: q/k/v and o; Qwen2: q/k/v only), and M-RoPE sections interleaved over the frequencies.
    qk_norm: bool = False
    qkv_bias: bool = True
    o_bias: bool = False
    mrope_interleaved: bool = False
    # Qwen3-VL-MoE: every layer's MLP is ``num_experts`` SwiGLU experts of width ``moe_intermediate_size``, each
    # token routed to ``num_experts_per_tok`` of them (softmax router, top-k weights renormalised); 0: dense MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

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
    # "qwen2_vl", "qwen2_5_vl" (same decoder; 2.5 has the RMSNorm/SwiGLU windowed vision tower) or "qwen3_vl"
    # (Qwen3's decoder, a LayerNorm tower with learned positions and DeepStack)
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
    # Runtime knob: how a sparse MLP (num_experts) reaches its experts (model/experts.py): "auto" (per backend:
    # "ragged" on TPU, else "grouped"), "grouped", "ragged" or "dense" (every expert on every token).
    moe_dispatch: str = "auto"

    def __post_init__(self):
        for part, names in _SIZES.items():
            for name in names.split():
                if getattr(getattr(self, part), name) < 1:
                    raise ValueError(f"{part} {name} must be >= 1, got {getattr(getattr(self, part), name)}")
        if self.text.head_dim < 0:
            raise ValueError(f"text head_dim must be >= 0 (0: hidden_size / heads), got {self.text.head_dim}")
        self._fill_in()
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"Qwen2VLConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.attention not in _ATTENTION:
            raise ValueError(f"attention {self.attention!r} is unknown (valid: {', '.join(_ATTENTION)})")
        if self.moe_dispatch not in _MOE_DISPATCH:
            raise ValueError(f"moe_dispatch {self.moe_dispatch!r} is unknown (valid: {', '.join(_MOE_DISPATCH)})")
        if self.attention_query_chunk < 0:
            raise ValueError(f"attention_query_chunk must be >= 0, got {self.attention_query_chunk}")
        t, v = self.text, self.vision
        if t.hidden_size % t.num_attention_heads and self.model_type != "qwen3_vl":
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
        self._check_qwen3()

    def _check_qwen3(self) -> None:
        """Qwen3-VL's own fields: DeepStack taps inside the tower, a position table; other families use none."""
        t, v = self.text, self.vision
        if self.model_type != "qwen3_vl":
            own = dict(
                qk_norm=t.qk_norm,
                o_bias=t.o_bias,
                mrope_interleaved=t.mrope_interleaved,
                num_position_embeddings=v.num_position_embeddings,
                deepstack_visual_indexes=v.deepstack_visual_indexes,
                num_experts=t.num_experts,
            )
            used = [k for k, val in own.items() if val]
            if used or not t.qkv_bias or t.head_dim * t.num_attention_heads != t.hidden_size:
                what = ", ".join(used) or ("qkv_bias" if not t.qkv_bias else "head_dim")
                raise ValueError(f"{what}: Qwen3-VL settings (model_type qwen3_vl), not {self.model_type}'s")
            return
        if not (t.qk_norm and t.mrope_interleaved) or t.qkv_bias != t.o_bias:
            raise ValueError(
                "qwen3_vl's decoder has q/k norms, interleaved M-RoPE and one attention_bias switch (text qk_norm, "
                "mrope_interleaved true; qkv_bias == o_bias)"
            )
        for i in v.deepstack_visual_indexes:
            if not 0 <= i < v.depth:
                raise ValueError(
                    f"vision deepstack_visual_indexes {list(v.deepstack_visual_indexes)}: {i} is outside the "
                    f"tower's blocks 0..{v.depth - 1}"
                )
        if v.position_grid_side < 1:
            raise ValueError(f"vision num_position_embeddings must be >= 1, got {v.num_position_embeddings}")
        if t.num_experts and not (1 <= t.num_experts_per_tok <= t.num_experts and t.moe_intermediate_size >= 1):
            raise ValueError(
                f"text num_experts_per_tok {t.num_experts_per_tok} must be in 1..num_experts ({t.num_experts}) and "
                f"moe_intermediate_size {t.moe_intermediate_size} >= 1"
            )

    def _fill_in(self) -> None:
        """The sizes left to follow the others: a ``text.head_dim`` of 0 (hidden_size / heads), an empty
        ``text.mrope_section`` (``mrope_split``) and a ``vision.hidden_size`` of 0 (the text width), written in
        once, when made."""
        t, v = self.text, self.vision
        if not t.head_dim:
            t = dataclasses.replace(t, head_dim=t.hidden_size // t.num_attention_heads)
            object.__setattr__(self, "text", t)
        if not t.mrope_section:
            object.__setattr__(self, "text", dataclasses.replace(t, mrope_section=mrope_split(t.head_dim)))
        if not v.hidden_size:
            object.__setattr__(self, "vision", dataclasses.replace(v, hidden_size=t.hidden_size))

    @property
    def hf_model_type(self) -> str:
        """The checkpoint's ``model_type``: the family's, or ``qwen3_vl_moe`` for a Qwen3-VL with experts."""
        return hf_config.MOE if self.text.num_experts else self.model_type

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
        family = hf_config.model_type(d, vis)
        text = TextConfig(**hf_config.text_fields(d, txt, family))
        vision = VisionConfig(**hf_config.vision_fields(vis, family, text.hidden_size))
        tie = d.get("tie_word_embeddings")
        if not tie and not (hf_config.is_moe(d) and tie is not None):  # MoE: the root's flag is the model's
            tie = bool(txt.get("tie_word_embeddings", False)) or bool(tie)
        kw = dict(
            vision=vision,
            text=text,
            image_token_id=int(d.get("image_token_id", 151655)),
            video_token_id=int(d.get("video_token_id", 151656)),
            vision_start_token_id=int(d.get("vision_start_token_id", 151652)),
            vision_end_token_id=int(d.get("vision_end_token_id", 151653)),
            tie_word_embeddings=bool(tie),
            model_type=family,
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
        family = self.model_type
        kind = self.hf_model_type
        return {
            "architectures": [hf_config.ARCHITECTURES[kind]],
            "model_type": kind,
            "text_config": hf_config.text_dict(self.text, family, self.param_dtype),
            "vision_config": hf_config.vision_dict(self.vision, family, self.param_dtype, kind),
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
            "dtype": self.param_dtype,
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
