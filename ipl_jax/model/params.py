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
    'copy', 'linear' ((out, in) -> (in, out)), 'conv' ((E, C, T, ps, ps) flattened to (E, C*T*ps*ps), transposed)
    or 'experts' (stacked experts, ours (experts, in, out): the published checkpoints' layout, or transformers-5's
    (experts, out, in), told apart by shape; ``weights.expert_layout``)."""

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
    Qwen2.5-VL has RMSNorms (scale only) and a SwiGLU MLP; Qwen2-VL and Qwen3-VL LayerNorms and a two-layer MLP;
    Qwen3-VL adds a patch bias, the learned position table and the DeepStack mergers (stacked, tap axis first)."""
    v = cfg.vision
    e, lv, m = v.embed_dim, v.depth, v.mlp_dim
    qwen25, qwen3 = cfg.model_type == "qwen2_5_vl", cfg.model_type == "qwen3_vl"
    out: list[ParamEntry] = [
        ParamEntry(
            ("visual", "patch_embed", "kernel"), (v.patch_dim, e), "normal", "visual.patch_embed.proj.weight", "conv"
        )
    ]
    if qwen3:
        out.append(ParamEntry(("visual", "patch_embed", "bias"), (e,), "zeros", "visual.patch_embed.proj.bias"))
    if v.num_position_embeddings:
        pos = ("visual", "pos_embed", "embedding")
        out.append(ParamEntry(pos, (v.num_position_embeddings, e), "normal", "visual.pos_embed.weight"))
    vb = "visual.blocks.{i}."
    for n in ("norm1", "norm2"):
        out.append(ParamEntry(("visual", "blocks", n, "scale"), (lv, e), "ones", vb + n + ".weight"))
        if not qwen25:
            out.append(ParamEntry(("visual", "blocks", n, "bias"), (lv, e), "zeros", vb + n + ".bias"))
    fc = "linear_fc" if qwen3 else "fc"  # the two-layer MLP's names in the checkpoint
    mlp = (
        (
            ("mlp", "gate_proj", e, m, "gate_proj"),
            ("mlp", "up_proj", e, m, "up_proj"),
            ("mlp", "down_proj", m, e, "down_proj"),
        )
        if qwen25
        else (("mlp", "fc1", e, m, fc + "1"), ("mlp", "fc2", m, e, fc + "2"))
    )
    for sub, name, din, dout, hf in (("attn", "qkv", e, 3 * e, "qkv"), ("attn", "proj", e, e, "proj")) + mlp:
        out += _dense_entries(("visual", "blocks", sub, name), (lv,), din, dout, f"{vb}{sub}.{hf}", bias=True)
    out += _merger_entries(cfg, ("visual", "merger"), (), "visual.merger", norm_width=e)
    if v.deepstack_visual_indexes:
        k = (len(v.deepstack_visual_indexes),)
        merged = v.merge_factor * e  # DeepStack mergers normalise after the merge (transformers' postshuffle norm)
        out += _merger_entries(cfg, ("visual", "deepstack_merger"), k, "visual.deepstack_merger_list.{i}", merged)
    return out


def _dense_entries(path, lead: tuple[int, ...], din: int, dout: int, hf: str, bias: bool) -> list[ParamEntry]:
    """The kernel (and bias) of one linear layer at ``path``: ``lead`` is () or (layers,) for a stacked one."""
    out = [ParamEntry(path + ("kernel",), lead + (din, dout), "normal", f"{hf}.weight", "linear")]
    if bias:
        out.append(ParamEntry(path + ("bias",), lead + (dout,), "zeros", f"{hf}.bias"))
    return out


def _merger_entries(cfg: Qwen2VLConfig, path, lead: tuple[int, ...], hf: str, norm_width: int) -> list[ParamEntry]:
    """A patch merger (norm, Linear(merged, merged), GELU, Linear(merged, hidden)) at ``path``; its norm spans
    ``norm_width`` (the ViT width, or the merged width after the merge). Checkpoint names: Qwen2-VL's
    ``ln_q`` / ``mlp.0`` / ``mlp.2``, Qwen3-VL's ``norm`` / ``linear_fc1`` / ``linear_fc2``."""
    v = cfg.vision
    me = v.merge_factor * v.embed_dim
    qwen3 = cfg.model_type == "qwen3_vl"
    norm, fc1, fc2 = ("norm", "linear_fc1", "linear_fc2") if qwen3 else ("ln_q", "mlp.0", "mlp.2")
    out = [ParamEntry(path + ("ln_q", "scale"), lead + (norm_width,), "ones", f"{hf}.{norm}.weight")]
    if cfg.model_type != "qwen2_5_vl":
        out.append(ParamEntry(path + ("ln_q", "bias"), lead + (norm_width,), "zeros", f"{hf}.{norm}.bias"))
    out += _dense_entries(path + ("mlp_0",), lead, me, me, f"{hf}.{fc1}", bias=True)
    out += _dense_entries(path + ("mlp_2",), lead, me, v.hidden_size, f"{hf}.{fc2}", bias=True)
    return out


def _text_layout(cfg: Qwen2VLConfig) -> list[ParamEntry]:
    """The language model's leaves: token embedding, the stacked decoder layers (layer axis first; q/k/v with
    biases unless ``qkv_bias`` is off, o_proj with one when ``o_bias``, Qwen3's per-head q/k norms, the SwiGLU MLP
    without), the final norm, and the LM head unless tied to the embedding."""
    t = cfg.text
    h, lt, i_dim = t.hidden_size, t.num_hidden_layers, t.intermediate_size
    dq, dkv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    out: list[ParamEntry] = [
        ParamEntry(("model", "embed_tokens", "embedding"), (t.vocab_size, h), "normal", "model.embed_tokens.weight")
    ]
    tl = "model.layers.{i}."
    for n in ("input_layernorm", "post_attention_layernorm"):
        out.append(ParamEntry(("model", "layers", n, "scale"), (lt, h), "ones", tl + n + ".weight"))
    attn = ("model", "layers", "self_attn")
    for name, dout in (("q_proj", dq), ("k_proj", dkv), ("v_proj", dkv)):
        out += _dense_entries(attn + (name,), (lt,), h, dout, f"{tl}self_attn.{name}", bias=t.qkv_bias)
    out += _dense_entries(attn + ("o_proj",), (lt,), dq, h, f"{tl}self_attn.o_proj", bias=t.o_bias)
    if t.qk_norm:
        for n in ("q_norm", "k_norm"):
            out.append(ParamEntry(attn + (n, "scale"), (lt, t.head_dim), "ones", f"{tl}self_attn.{n}.weight"))
    if t.num_experts:
        out += _expert_entries(cfg)
    else:
        for name, din, dout in (("gate_proj", h, i_dim), ("up_proj", h, i_dim), ("down_proj", i_dim, h)):
            out += _dense_entries(("model", "layers", "mlp", name), (lt,), din, dout, f"{tl}mlp.{name}", bias=False)
    out.append(ParamEntry(("model", "norm", "scale"), (h,), "ones", "model.norm.weight"))
    if not cfg.tie_word_embeddings:
        out.append(ParamEntry(("lm_head", "kernel"), (h, t.vocab_size), "normal", "lm_head.weight", "linear"))
    return out


def _expert_entries(cfg: Qwen2VLConfig) -> list[ParamEntry]:
    """Qwen3-VL-MoE's sparse MLP of every layer: the router (``gate``, [hidden, experts]) and the experts' fused
    gate-and-up projection [experts, hidden, 2 * moe_intermediate] (gate columns first) and down projection
    [experts, moe_intermediate, hidden], layer axis first."""
    t = cfg.text
    lt, h, e, m = t.num_hidden_layers, t.hidden_size, t.num_experts, t.moe_intermediate_size
    tl = "model.layers.{i}.mlp."
    ex = ("model", "layers", "mlp", "experts")
    return _dense_entries(("model", "layers", "mlp", "gate"), (lt,), h, e, tl + "gate", bias=False) + [
        ParamEntry(ex + ("gate_up_proj",), (lt, e, h, 2 * m), "normal", tl + "experts.gate_up_proj", "experts"),
        ParamEntry(ex + ("down_proj",), (lt, e, m, h), "normal", tl + "experts.down_proj", "experts"),
    ]


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
