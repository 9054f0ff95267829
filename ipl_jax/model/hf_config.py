"""Hugging Face ``config.json`` layouts of the three families (``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``; Qwen3-VL's
mixture-of-experts checkpoints, ``qwen3_vl_moe``, are the ``qwen3_vl`` family with experts in the text part): the
field values of ``TextConfig`` / ``VisionConfig`` read from the flat Hub or the nested transformers-5 layout, and
the nested layout written back. Plain dicts in and out (``config.py`` builds the dataclasses), so this module
imports nothing of the model.

Missing fields take transformers' class defaults of the family named by ``model_type``.
"""

from __future__ import annotations

from typing import Any

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
MOE = "qwen3_vl_moe"  # the model_type of Qwen3-VL's mixture-of-experts checkpoints (family qwen3_vl)
ARCHITECTURES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    MOE: "Qwen3VLMoeForConditionalGeneration",
}
# transformers' class defaults where the families differ (text; the vision ones are in vision_fields)
_TEXT_DEFAULTS = {
    "qwen2_vl": dict(vocab=152064, hidden=8192, inter=29568, layers=80, heads=64, max_pos=32768, eps=1e-5, theta=1e6),
    "qwen2_5_vl": dict(vocab=152064, hidden=8192, inter=29568, layers=80, heads=64, max_pos=32768, eps=1e-5, theta=1e6),
    "qwen3_vl": dict(vocab=151936, hidden=4096, inter=22016, layers=32, heads=32, max_pos=128000, eps=1e-6, theta=5e5),
    MOE: dict(vocab=151936, hidden=2048, inter=5632, layers=24, heads=16, max_pos=128000, eps=1e-6, theta=5e5),
}
_MROPE_DEFAULT = {"qwen2_vl": (16, 24, 24), "qwen2_5_vl": (16, 24, 24), "qwen3_vl": (24, 20, 20)}


def model_type(d: dict[str, Any], vis: dict[str, Any]) -> str:
    """The family: 'qwen3_vl' when the root ``model_type`` or the architectures say so; 'qwen2_5_vl' when the root
    model_type, the architectures or the vision config say so; else 'qwen2_vl'. An unknown root ``model_type``:
    ValueError naming it."""
    root = d.get("model_type")
    if root not in (None, *FAMILIES, MOE):
        raise ValueError(f"model_type {root!r} is not supported (supported: {', '.join(FAMILIES + (MOE,))})")
    archs = [str(a) for a in d.get("architectures") or ()]
    if root in ("qwen3_vl", MOE) or (root is None and any(a.startswith("Qwen3VL") for a in archs)):
        return "qwen3_vl"
    if (
        root == "qwen2_5_vl"
        or any(a.startswith("Qwen2_5_VL") for a in archs)
        or vis.get("model_type") in ("qwen2_5_vl", "qwen2_5_vl_vision")
    ):
        return "qwen2_5_vl"
    return "qwen2_vl"


def is_moe(d: dict[str, Any]) -> bool:
    """Whether a ``config.json`` dict is a Qwen3-VL mixture-of-experts checkpoint (its model_type or architectures)."""
    if d.get("model_type") is not None:
        return d["model_type"] == MOE
    return any(str(a).startswith("Qwen3VLMoe") for a in d.get("architectures") or ())


def text_fields(d: dict[str, Any], txt: dict[str, Any], family: str) -> dict[str, Any]:
    """``TextConfig`` keyword arguments from a ``config.json`` dict ``d`` and its text part ``txt`` (``d`` itself in
    the flat layout; rope, eos, bos and pad may sit at either level). Rejects what the decoder does not run."""
    moe = is_moe(d)
    dft = _TEXT_DEFAULTS[MOE if moe else family]
    rope = txt.get("rope_parameters") or txt.get("rope_scaling") or d.get("rope_scaling") or {}
    mrope = tuple(int(s) for s in rope.get("mrope_section", _MROPE_DEFAULT[family]))
    rope_theta = rope.get("rope_theta", txt.get("rope_theta", d.get("rope_theta", dft["theta"])))
    eos = txt.get("eos_token_id", d.get("eos_token_id", 151645))
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else ((int(eos),) if eos is not None else ())
    heads = int(txt.get("num_attention_heads", dft["heads"]))
    if txt.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported (HF honours it only with flash attention)")
    out = dict(
        vocab_size=int(txt.get("vocab_size", dft["vocab"])),
        hidden_size=int(txt.get("hidden_size", dft["hidden"])),
        intermediate_size=int(txt.get("intermediate_size", dft["inter"])),
        num_hidden_layers=int(txt.get("num_hidden_layers", dft["layers"])),
        num_attention_heads=heads,
        num_key_value_heads=int(txt.get("num_key_value_heads") or heads),
        rms_norm_eps=float(txt.get("rms_norm_eps", dft["eps"])),
        rope_theta=float(rope_theta),
        mrope_section=mrope,
        max_position_embeddings=int(txt.get("max_position_embeddings", dft["max_pos"])),
        hidden_act=str(txt.get("hidden_act", "silu")),
        bos_token_id=txt.get("bos_token_id", d.get("bos_token_id")),
        eos_token_id=eos,
        pad_token_id=txt.get("pad_token_id", d.get("pad_token_id")),
    )
    if family == "qwen3_vl":  # Qwen3's attention: q/k norms, one bias switch, its own head_dim; interleaved M-RoPE
        bias = bool(txt.get("attention_bias", False))
        out.update(
            head_dim=int(txt.get("head_dim") or (out["hidden_size"] // heads if moe else 128)),
            qk_norm=True,
            qkv_bias=bias,
            o_bias=bias,
            mrope_interleaved=True,  # transformers' Qwen3-VL rotary always interleaves
        )
    if moe:
        out.update(_expert_fields(txt))
    return out


def _expert_fields(txt: dict[str, Any]) -> dict[str, Any]:
    """The experts of a ``qwen3_vl_moe`` text config (transformers' defaults where absent). Only every layer sparse
    (``decoder_sparse_step`` 1, no ``mlp_only_layers``) and renormalised top-k weights (transformers' router always
    renormalises) are run; anything else is rejected naming the field."""
    step = txt.get("decoder_sparse_step", 1)
    if step != 1:
        raise ValueError(f"text_config.decoder_sparse_step {step} is not supported (only 1: every layer sparse)")
    if txt.get("mlp_only_layers"):
        raise ValueError(f"text_config.mlp_only_layers {txt['mlp_only_layers']} is not supported (only [])")
    if txt.get("norm_topk_prob", True) is not True:
        raise ValueError("text_config.norm_topk_prob false is not supported (Qwen3-VL-MoE renormalises the top-k)")
    experts = int(txt.get("num_experts", txt.get("num_local_experts", 60)))
    if experts < 1:
        raise ValueError(f"text_config.num_experts {experts} must be >= 1 for {MOE}")
    return dict(
        num_experts=experts,
        num_experts_per_tok=int(txt.get("num_experts_per_tok", 4)),
        moe_intermediate_size=int(txt.get("moe_intermediate_size", 1408)),
    )


def vision_fields(vis: dict[str, Any], family: str, text_hidden: int) -> dict[str, Any]:
    """``VisionConfig`` keyword arguments from the ``vision_config`` dict ``vis``. Qwen2.5-VL and Qwen3-VL name the
    ViT width hidden_size and the merger's output out_hidden_size; Qwen2-VL's merger output (hidden_size)
    defaults to the text width ``text_hidden``."""
    vrope = vis.get("rope_parameters") or {}
    patch = vis.get("patch_size", 16 if family == "qwen3_vl" else 14)
    tpatch = vis.get("temporal_patch_size", 2)
    if isinstance(patch, (list, tuple)) or isinstance(tpatch, (list, tuple)):
        raise ValueError(f"non-scalar patch sizes are not supported: {patch!r}, {tpatch!r}")
    common = dict(
        depth=int(vis.get("depth", {"qwen3_vl": 27}.get(family, 32))),
        num_heads=int(vis.get("num_heads", 16)),
        in_channels=int(vis.get("in_channels", 3)),  # HF ignores the old 'in_chans' key too
        patch_size=int(patch),
        spatial_merge_size=int(vis.get("spatial_merge_size", 2)),
        temporal_patch_size=int(tpatch),
        rope_theta=float(vrope.get("rope_theta", 10000.0)),
    )
    if family == "qwen2_5_vl":
        return dict(
            embed_dim=int(vis.get("hidden_size", 3584)),
            hidden_size=int(vis.get("out_hidden_size", 3584)),
            intermediate_size=int(vis.get("intermediate_size", 3420)),
            hidden_act=str(vis.get("hidden_act", "silu")),
            window_size=int(vis.get("window_size", 112)),
            fullatt_block_indexes=tuple(int(i) for i in vis.get("fullatt_block_indexes", (7, 15, 23, 31))),
            tokens_per_second=int(vis.get("tokens_per_second", 4)),
            **common,
        )
    if family == "qwen3_vl":
        return dict(
            embed_dim=int(vis.get("hidden_size", 1152)),
            hidden_size=int(vis.get("out_hidden_size", 3584)),
            intermediate_size=int(vis.get("intermediate_size", 4304)),
            hidden_act=str(vis.get("hidden_act", "gelu_pytorch_tanh")),
            num_position_embeddings=int(vis.get("num_position_embeddings", 2304)),
            deepstack_visual_indexes=tuple(int(i) for i in vis.get("deepstack_visual_indexes", (8, 16, 24))),
            **common,
        )
    return dict(
        embed_dim=int(vis.get("embed_dim", 1280)),
        hidden_size=int(vis.get("hidden_size", text_hidden)),
        mlp_ratio=int(vis.get("mlp_ratio", 4)),
        hidden_act=str(vis.get("hidden_act", "quick_gelu")),
        **common,
    )


def text_dict(t, family: str, dtype: str) -> dict[str, Any]:
    """The nested layout's ``text_config`` of the ``TextConfig`` ``t``."""
    eos = list(t.eos_token_id)
    kind = MOE if t.num_experts else family
    out = {
        "model_type": f"{kind}_text",
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
        "rope_parameters": {"rope_type": "default", "mrope_section": list(t.mrope_section), "rope_theta": t.rope_theta},
        "bos_token_id": t.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": t.pad_token_id,
        "dtype": dtype,
    }
    if family == "qwen3_vl":
        del out["use_sliding_window"], out["sliding_window"]
        out.update(head_dim=t.head_dim, attention_bias=t.qkv_bias)
        out["rope_parameters"]["mrope_interleaved"] = True
    if t.num_experts:
        out.update(
            num_experts=t.num_experts,
            num_experts_per_tok=t.num_experts_per_tok,
            moe_intermediate_size=t.moe_intermediate_size,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return out


def vision_dict(v, family: str, dtype: str, kind: str = "") -> dict[str, Any]:
    """The nested layout's ``vision_config`` of the ``VisionConfig`` ``v`` (``kind``: the root model_type, when it
    is not the family's: ``MOE``)."""
    out = {
        "model_type": f"{kind or family}_vision",
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
        "dtype": dtype,
    }
    if family == "qwen2_vl":
        return out
    for k in ("embed_dim", "mlp_ratio"):  # the later families: hidden_size = ViT width, out_hidden_size = merger
        del out[k]
    out.update(hidden_size=v.embed_dim, out_hidden_size=v.hidden_size, intermediate_size=v.mlp_dim)
    if family == "qwen2_5_vl":
        out.update(
            window_size=v.window_size,
            fullatt_block_indexes=list(v.fullatt_block_indexes),
            tokens_per_second=v.tokens_per_second,
        )
    else:
        out.update(
            num_position_embeddings=v.num_position_embeddings,
            deepstack_visual_indexes=list(v.deepstack_visual_indexes),
        )
    return out
