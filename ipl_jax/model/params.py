"""The parameter tree: its layout (``param_layout``: path, shape, HF name per leaf; stacked leaves lead with the
layer axis, kernels are (in, out)), its Hugging Face names, and random initialisation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig


@dataclasses.dataclass(frozen=True)
class ParamEntry:
    """One leaf: tree path, full shape, init kind, HF tensor name (``{i}`` when stacked) and the HF -> ours mapping:
    'copy', 'linear' ((out, in) -> (in, out)) or 'conv' ((E, C, T, ps, ps) flattened to (E, C*T*ps*ps), transposed)."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    init: str  # normal | zeros | ones
    hf_name: str
    transform: str = "copy"

    @property
    def stacked(self) -> bool:
        return "{i}" in self.hf_name

    @property
    def key(self) -> str:
        return "/".join(self.path)


def param_layout(cfg: Qwen2VLConfig) -> list[ParamEntry]:
    """Every leaf of the parameter tree for ``cfg``: the vision tower's, then the language model's."""
    return _vision_layout(cfg) + _text_layout(cfg)


def _vision_layout(cfg: Qwen2VLConfig) -> list[ParamEntry]:
    """The vision tower's leaves: patch embedding, the stacked blocks (layer axis first), the patch merger.
    Qwen2.5-VL has RMSNorms (scale only) and a SwiGLU MLP; Qwen2-VL LayerNorms and a two-layer MLP."""
    v = cfg.vision
    e, lv, m = v.embed_dim, v.depth, v.mlp_dim
    me = v.merge_factor * e
    out: list[ParamEntry] = [
        ParamEntry(
            ("visual", "patch_embed", "kernel"), (v.patch_dim, e), "normal", "visual.patch_embed.proj.weight", "conv"
        )
    ]
    vb = "visual.blocks.{i}."
    qwen25 = cfg.model_type == "qwen2_5_vl"  # RMSNorms (no bias) and a SwiGLU MLP (with biases)
    for n in ("norm1", "norm2"):
        out.append(ParamEntry(("visual", "blocks", n, "scale"), (lv, e), "ones", vb + n + ".weight"))
        if not qwen25:
            out.append(ParamEntry(("visual", "blocks", n, "bias"), (lv, e), "zeros", vb + n + ".bias"))
    mlp = (
        (("mlp", "gate_proj", e, m), ("mlp", "up_proj", e, m), ("mlp", "down_proj", m, e))
        if qwen25
        else (("mlp", "fc1", e, m), ("mlp", "fc2", m, e))
    )
    for sub, name, din, dout in (("attn", "qkv", e, 3 * e), ("attn", "proj", e, e)) + mlp:
        out += [
            ParamEntry(
                ("visual", "blocks", sub, name, "kernel"),
                (lv, din, dout),
                "normal",
                f"{vb}{sub}.{name}.weight",
                "linear",
            ),
            ParamEntry(("visual", "blocks", sub, name, "bias"), (lv, dout), "zeros", f"{vb}{sub}.{name}.bias"),
        ]
    out.append(ParamEntry(("visual", "merger", "ln_q", "scale"), (e,), "ones", "visual.merger.ln_q.weight"))
    if not qwen25:
        out.append(ParamEntry(("visual", "merger", "ln_q", "bias"), (e,), "zeros", "visual.merger.ln_q.bias"))
    for idx, din, dout in ((0, me, me), (2, me, v.hidden_size)):
        out += [
            ParamEntry(
                ("visual", "merger", f"mlp_{idx}", "kernel"),
                (din, dout),
                "normal",
                f"visual.merger.mlp.{idx}.weight",
                "linear",
            ),
            ParamEntry(("visual", "merger", f"mlp_{idx}", "bias"), (dout,), "zeros", f"visual.merger.mlp.{idx}.bias"),
        ]
    return out


def _text_layout(cfg: Qwen2VLConfig) -> list[ParamEntry]:
    """The language model's leaves: token embedding, the stacked decoder layers (layer axis first; q/k/v with
    biases, o_proj and the SwiGLU MLP without), the final norm, and the LM head unless tied to the embedding."""
    t = cfg.text
    h, lt, i_dim = t.hidden_size, t.num_hidden_layers, t.intermediate_size
    dq, dkv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    out: list[ParamEntry] = [
        ParamEntry(("model", "embed_tokens", "embedding"), (t.vocab_size, h), "normal", "model.embed_tokens.weight")
    ]
    tl = "model.layers.{i}."
    for n in ("input_layernorm", "post_attention_layernorm"):
        out.append(ParamEntry(("model", "layers", n, "scale"), (lt, h), "ones", tl + n + ".weight"))
    for name, dout in (("q_proj", dq), ("k_proj", dkv), ("v_proj", dkv)):
        out += [
            ParamEntry(
                ("model", "layers", "self_attn", name, "kernel"),
                (lt, h, dout),
                "normal",
                f"{tl}self_attn.{name}.weight",
                "linear",
            ),
            ParamEntry(
                ("model", "layers", "self_attn", name, "bias"), (lt, dout), "zeros", f"{tl}self_attn.{name}.bias"
            ),
        ]
    out.append(
        ParamEntry(
            ("model", "layers", "self_attn", "o_proj", "kernel"),
            (lt, dq, h),
            "normal",
            f"{tl}self_attn.o_proj.weight",
            "linear",
        )
    )
    for name, din, dout in (("gate_proj", h, i_dim), ("up_proj", h, i_dim), ("down_proj", i_dim, h)):
        out.append(
            ParamEntry(
                ("model", "layers", "mlp", name, "kernel"),
                (lt, din, dout),
                "normal",
                f"{tl}mlp.{name}.weight",
                "linear",
            )
        )
    out.append(ParamEntry(("model", "norm", "scale"), (h,), "ones", "model.norm.weight"))
    if not cfg.tie_word_embeddings:
        out.append(ParamEntry(("lm_head", "kernel"), (h, t.vocab_size), "normal", "lm_head.weight", "linear"))
    return out


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def get_path(tree: dict, path: tuple[str, ...]):
    for k in path:
        tree = tree[k]
    return tree


def iter_paths(tree, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(path, leaf) for every leaf of a nested dict."""
    if isinstance(tree, dict):
        for k in sorted(tree):
            yield from iter_paths(tree[k], prefix + (k,))
    else:
        yield prefix, tree


def init_params(cfg: Qwen2VLConfig, rng: jax.Array, std: float = 0.02) -> dict:
    """Random ``cfg.param_dtype`` parameters: normal(0, std) kernels and embeddings, unit norm scales, zero biases."""
    dtype = jnp.dtype(cfg.param_dtype)
    layout = param_layout(cfg)
    keys = jax.random.split(rng, len(layout))
    params: dict = {}
    for key, ent in zip(keys, layout):
        if ent.init == "normal":
            val = (std * jax.random.normal(key, ent.shape, jnp.float32)).astype(dtype)
        elif ent.init == "ones":
            val = jnp.ones(ent.shape, dtype)
        else:
            val = jnp.zeros(ent.shape, dtype)
        set_path(params, ent.path, val)
    return params


def param_shapes(cfg: Qwen2VLConfig) -> dict:
    """The parameter tree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    dtype = jnp.dtype(cfg.param_dtype)
    out: dict = {}
    for ent in param_layout(cfg):
        set_path(out, ent.path, jax.ShapeDtypeStruct(ent.shape, dtype))
    return out


def count_params(params) -> int:
    """Number of scalars in a parameter pytree (arrays or shape structs)."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))
