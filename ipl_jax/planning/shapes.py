"""The plan's inputs: the published Qwen2-VL and Qwen3-VL architectures and the job's fresh model, the job's batch
shapes (``JobShapes.of``: the largest buckets of each program), the mesh, and abstract batches of the SFT step,
T-DPO step and sampler.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.sharding import AXES
from ipl_jax.model.vision import VisionInputs
from ipl_jax.preference.packed_batch import PackedBatch
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.settings import ModelSettings, Settings

PROGRAMS = ("sft", "tdpo", "prefill", "decode")
GB = 1e9

_SPECIAL = dict(
    bos_token_id=151643,
    eos_token_id=151645,
    vision_start_token_id=151652,
    vision_end_token_id=151653,
    image_token_id=151655,
    video_token_id=151656,
)
_TEXT = dict(
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    use_sliding_window=False,
)
_VISION = dict(
    depth=32,
    embed_dim=1280,
    hidden_act="quick_gelu",
    mlp_ratio=4,
    num_heads=16,
    in_chans=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
)


def _qwen2(vocab: int, hidden: int, mlp: int, heads: int, kv_heads: int, tied: bool) -> dict:
    """A published Qwen2-VL config.json (flat Hub layout; torch_dtype: the dtype it ships in), 28 layers."""
    return dict(
        architectures=["Qwen2VLForConditionalGeneration"],
        model_type="qwen2_vl",
        torch_dtype="bfloat16",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=28,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tied,
        **_TEXT,
        **_SPECIAL,
        vision_config=dict(_VISION, hidden_size=hidden),
    )


# The published Qwen2-VL-2B / 7B (Instruct): vocabulary, width, MLP, heads, KV heads, tied embeddings.
ARCHITECTURES = {
    "qwen2-vl-2b": _qwen2(151936, 1536, 8960, 12, 2, True),
    "qwen2-vl-7b": _qwen2(152064, 3584, 18944, 28, 4, False),
}
_TEXT3 = dict(
    model_type="qwen3_vl_text",
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    rope_theta=5000000,
    rope_scaling={"rope_type": "default", "mrope_interleaved": True, "mrope_section": [24, 20, 20]},
    attention_bias=False,
    vocab_size=151936,
    num_key_value_heads=8,
)
_VISION3 = dict(
    model_type="qwen3_vl",
    hidden_act="gelu_pytorch_tanh",
    num_heads=16,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=2304,
)


def _qwen3(tied: bool, text: dict, vision: dict, taps: list[int]) -> dict:
    """A published Qwen3-VL config.json (nested layout) from the fields its sizes set."""
    return dict(
        architectures=["Qwen3VLForConditionalGeneration"],
        model_type="qwen3_vl",
        dtype="bfloat16",
        tie_word_embeddings=tied,
        **_SPECIAL,
        text_config=dict(_TEXT3, tie_word_embeddings=tied, **text),
        vision_config=dict(_VISION3, **vision, deepstack_visual_indexes=taps),
    )


# The published Qwen3-VL-2B / 8B (Instruct) config.json files: text width, MLP, layers, heads; the tower's depth,
# width, MLP, output width and DeepStack taps.
ARCHITECTURES |= {
    "qwen3-vl-2b": _qwen3(
        True,
        dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16),
        dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2048),
        [5, 11, 17],
    ),
    "qwen3-vl-8b": _qwen3(
        False,
        dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32),
        dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=4096),
        [8, 16, 24],
    ),
}
# The published Qwen3-VL-30B-A3B (Instruct) config.json: the same decoder with a sparse MLP in every layer (128
# experts of width 768, 8 per token), 48 layers of width 2048, 32 query / 4 KV heads of 128; untied embeddings; the
# 27-block 1152-wide tower of the 8B (transformers' Qwen3VLMoeVisionConfig defaults) with a 2048-wide output.
_MOE_TEXT = dict(
    _TEXT3,
    model_type="qwen3_vl_moe_text",
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
)
ARCHITECTURES["qwen3-vl-30b-a3b"] = dict(
    _qwen3(False, {}, dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=2048), [8, 16, 24]),
    architectures=["Qwen3VLMoeForConditionalGeneration"],
    model_type="qwen3_vl_moe",
    text_config=dict(_MOE_TEXT, tie_word_embeddings=False),
)
_CONFIG_ARCH = (
    (r"qwen2vl_2b", "qwen2-vl-2b"),
    (r"qwen2vl_7b", "qwen2-vl-7b"),
    (r"qwen3vl_2b", "qwen3-vl-2b"),
    (r"qwen3vl_8b", "qwen3-vl-8b"),
    (r"qwen3vl_30b_a3b", "qwen3-vl-30b-a3b"),
)
_KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)


class PlanError(ValueError):
    """A plan that cannot be made as asked; one line naming the setting and its valid values."""


# ------------------------------------------------------------------------------------------------ inputs


def architecture_dtype(name: str) -> str:
    """The dtype a published architecture ships in (its torch_dtype), float32 for any other model: the plan's
    ``default_dtype`` for ``Settings.resolved`` (a model.dtype of 'auto' with no checkpoint on disk)."""
    if name not in ARCHITECTURES:
        return "float32"
    arch = ARCHITECTURES[name]
    return arch.get("torch_dtype", arch.get("dtype", "float32"))


def model_config(m: ModelSettings, config_name: str = "", arch: str = "auto") -> tuple[str, Qwen2VLConfig]:
    """(architecture name, model config): ``arch`` from ``ARCHITECTURES``, or 'auto' (the checkpoint's config.json,
    else the config file's name, else the fresh model of the ``model`` section: ``ModelSettings.fresh_config``)."""
    if arch != "auto":
        if arch not in ARCHITECTURES:
            raise PlanError(f"--arch {arch!r} is unknown (valid: auto, {', '.join(ARCHITECTURES)})")
        return arch, Qwen2VLConfig.from_hf_dict(ARCHITECTURES[arch])
    ckpt = m.checkpoint_dir()
    if ckpt and os.path.isfile(os.path.join(ckpt, "config.json")):
        return ckpt, Qwen2VLConfig.from_dir(ckpt)
    stem = os.path.basename(config_name.split(":")[0])
    for pattern, name in _CONFIG_ARCH:
        if re.match(pattern, stem):
            return name, Qwen2VLConfig.from_hf_dict(ARCHITECTURES[name])
    # the job's fresh model (as model_stage builds it), its special tokens at the top of the vocabulary (the plan
    # has no tokenizer)
    return "config.model", m.fresh_config()


@dataclasses.dataclass(frozen=True)
class JobShapes:
    """The batch shapes of the job's programs (see the module docstring)."""

    tdpo_rows: int
    tdpo_length: int
    tdpo_slots: int
    tdpo_pairs: int
    image_patches: int
    sft_batch: int
    sft_micro: int
    sft_length: int
    sampler_batch: int
    prefix_length: int
    prompt_length: int
    branching: tuple

    @staticmethod
    def of(settings: Settings) -> JobShapes:
        s = settings
        return JobShapes(
            tdpo_rows=s.ipl.batch_size,
            tdpo_length=max(s.ipl.text_buckets),
            tdpo_slots=max(s.sampler.tree.branching) + 1,
            tdpo_pairs=s.ipl.max_pairs_per_batch,
            image_patches=s.buckets.image_patches,
            sft_batch=s.sft.batch_size,
            sft_micro=s.sft.micro,
            sft_length=max(s.buckets.tokens),
            sampler_batch=s.sampler.batch_size,
            prefix_length=max(s.sampler.tree.prefix_buckets),
            prompt_length=max(s.sampler.tree.prompt_buckets),
            branching=s.sampler.tree.branching,
        )


def parse_mesh(text: str) -> dict:
    """'data=1,fsdp=8,tensor=1' -> {'data': 1, 'fsdp': 8, 'tensor': 1} (missing axes are 1)."""
    out = {a: 1 for a in AXES}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in AXES or not value.strip().isdigit() or int(value) < 1:
            raise PlanError(
                f"--mesh {text!r}: expected AXIS=SIZE,... with axes {', '.join(AXES)} and sizes >= 1 "
                "(e.g. data=1,fsdp=8,tensor=1)"
            )
        out[name.strip()] = int(value)
    return out


def check_mesh_arg(mesh_arg: dict, n_devices: int) -> None:
    """PlanError when ``--mesh`` (every axis given, sizes >= 1) does not cover ``n_devices``."""
    n = math.prod(mesh_arg.values())
    if n != n_devices:
        spec = ",".join(f"{a}={mesh_arg[a]}" for a in AXES)
        raise PlanError(
            f"mesh {spec} needs {n} devices but there are {n_devices} (valid: sizes whose product is {n_devices}, "
            f"e.g. data=1,fsdp={n_devices},tensor=1)"
        )


# ---------------------------------------------------------------------------------------- abstract values

_S = jax.ShapeDtypeStruct


def _vision(cfg: Qwen2VLConfig, lead: tuple, patches: int) -> VisionInputs:
    return VisionInputs(
        patches=_S(lead + (patches, cfg.vision.patch_dim), jnp.float32),
        pos_hw=_S(lead + (patches, 2), jnp.int32),
        segment_ids=_S(lead + (patches,), jnp.int32),
    )


def tdpo_batch(cfg: Qwen2VLConfig, s: JobShapes) -> PackedBatch:
    b, t, p = s.tdpo_rows, s.tdpo_length, s.tdpo_pairs
    i32 = lambda *shape: _S(shape, jnp.int32)
    return PackedBatch(
        input_ids=i32(b, t),
        positions=i32(3, b, t),
        segment_ids=i32(b, t),
        target_ids=i32(b, t),
        score_slot=i32(b, t),
        vision=_vision(cfg, (b,), s.image_patches),
        pair_pos=i32(p),
        pair_neg=i32(p),
        pair_valid=_S((p,), jnp.bool_),
        pair_turn=i32(p),
        ref_pos=_S((p,), jnp.float32),
        ref_neg=_S((p,), jnp.float32),
        max_continuations=s.tdpo_slots,
    )


def sft_batch(cfg: Qwen2VLConfig, s: JobShapes) -> dict:
    accum = s.sft_batch // s.sft_micro
    lead = (accum,) if accum > 1 else ()
    b, t = s.sft_micro, s.sft_length
    return {
        "input_ids": _S(lead + (b, t), jnp.int32),
        "attention_mask": _S(lead + (b, t), jnp.bool_),
        "loss_mask": _S(lead + (b, t), jnp.int32),
        "positions": _S(lead + (3, b, t), jnp.int32),
        "vision": _vision(cfg, lead + (b,), s.image_patches),  # one image slot per dialogue
    }


def sampler_config(cfg: Qwen2VLConfig, settings: Settings) -> SamplerConfig:
    """The job's sampler (``SamplerSettings.build``) with the special ids the model config names: a plan reads no
    tokenizer, and of the ids the sampler reads only the end-of-turn, pad and vision placeholders."""
    eos = tuple(cfg.text.eos_token_id) or (cfg.text.vocab_size - 1,)
    ids = types.SimpleNamespace(
        eos=eos,
        pad=eos[0] if cfg.text.pad_token_id is None else cfg.text.pad_token_id,
        image_pad=cfg.image_token_id,
        video_pad=cfg.video_token_id,
        vision_start=cfg.vision_start_token_id,
        vision_end=cfg.vision_end_token_id,
    )
    return settings.sampler.build(ids, settings.buckets, settings.eval.batch_size)
