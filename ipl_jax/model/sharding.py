"""Meshes (``('data', 'fsdp', 'tensor')``, Auto axes), partition rules and the shardings of parameters, inputs
and KV caches. Rules are regexes over '/'-joined paths (first match wins); stacked leaves keep the layer axis
unsharded, and a mesh axis that does not divide its dimension is dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.decode import KVCache
from ipl_jax.model.inputs import ModelInputs
from ipl_jax.model.params import iter_paths, set_path

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# Logical axes a rule may name, and the mesh axis each is laid on. 'expert': the experts of a sparse MLP are split
# over 'fsdp' (like the other weights, each device stores 1/fsdp of them; the mesh has no axis of its own for them).
LOGICAL_AXES = {"expert": "fsdp"}

# (regex over the '/'-joined path, spec per dimension *after* any leading layer axis)
DEFAULT_RULES: tuple[tuple[str, tuple], ...] = (
    (r"model/embed_tokens/embedding$", ("tensor", "fsdp")),
    (r"lm_head/kernel$", ("fsdp", "tensor")),
    (r"self_attn/(q|k|v)_proj/kernel$", ("fsdp", "tensor")),
    (r"self_attn/(q|k|v)_proj/bias$", ("tensor",)),
    (r"self_attn/o_proj/kernel$", ("tensor", "fsdp")),
    (r"mlp/(gate|up)_proj/kernel$", ("fsdp", "tensor")),
    (r"mlp/down_proj/kernel$", ("tensor", "fsdp")),
    (r"mlp/experts/gate_up_proj$", ("expert", None, "tensor")),  # [E, hidden, 2I]
    (r"mlp/experts/down_proj$", ("expert", "tensor", None)),  # [E, I, hidden]
    (r"attn/qkv/kernel$", ("fsdp", "tensor")),
    (r"attn/qkv/bias$", ("tensor",)),
    (r"attn/proj/kernel$", ("tensor", "fsdp")),
    (r"mlp/fc1/kernel$", ("fsdp", "tensor")),
    (r"mlp/fc1/bias$", ("tensor",)),
    (r"mlp/fc2/kernel$", ("tensor", "fsdp")),
    (r"merger/mlp_0/kernel$", ("fsdp", "tensor")),
    (r"merger/mlp_0/bias$", ("tensor",)),
    (r"merger/mlp_2/kernel$", ("tensor", "fsdp")),
    (r"patch_embed/kernel$", (None, "fsdp")),
    (r".*", ()),  # everything else (norms, row-parallel biases) replicated
)

_STACKED = re.compile(r"^(visual/blocks|visual/deepstack_merger|model/layers)/")


def make_mesh(shape: Sequence[int] = (1, -1, 1), axes: Sequence[str] = AXES, devices=None) -> Mesh:
    """A mesh with Auto axis types. ``shape`` may hold one -1 (all remaining devices)."""
    devs = list(jax.devices() if devices is None else devices)
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {shape} has more than one -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = len(devs) // known
    if math.prod(shape) != len(devs):
        raise ValueError(f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices, have {len(devs)}")
    arr = np.asarray(devs, dtype=object).reshape(shape)
    return Mesh(arr, tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def _fit(spec: Sequence, shape: Sequence[int], mesh: Mesh) -> P:
    """Lays logical axes (``LOGICAL_AXES``) on their mesh axes, then drops axes that the mesh lacks or whose size
    does not divide the dimension."""
    out = []
    for dim, ax in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if ax is None else ((ax,) if isinstance(ax, str) else tuple(ax))
        names = tuple(LOGICAL_AXES.get(n, n) for n in names)
        names = tuple(n for n in names if n in mesh.shape)
        size = math.prod(mesh.shape[n] for n in names) if names else 1
        if not names or dim % size:
            out.append(None)
        else:
            out.append(names[0] if len(names) == 1 else names)
    return P(*out)


def spec_for(path: str, shape: Sequence[int], mesh: Mesh, rules=DEFAULT_RULES) -> P:
    """The PartitionSpec of one leaf: the first rule matching ``path``, shifted past the layer axis of
    stacked leaves, then fitted to the shape."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            spec = tuple(spec)
            if _STACKED.match(path):
                spec = (None,) + spec
            return _fit(spec, shape, mesh)
    return P()


def param_shardings(params_or_shapes: dict, mesh: Mesh, rules=DEFAULT_RULES) -> dict:
    """A pytree of NamedSharding matching the parameter tree (arrays or ShapeDtypeStructs)."""
    out: dict = {}
    for path, leaf in iter_paths(params_or_shapes):
        set_path(out, path, NamedSharding(mesh, spec_for("/".join(path), leaf.shape, mesh, rules)))
    return out


def shard_params(params: dict, shardings: dict) -> dict:
    """Places an existing parameter tree into the given shardings."""
    return jax.tree.map(lambda a, s: jax.device_put(a, s), params, shardings)


def batch_spec(mesh: Mesh, shape: Sequence[int], batch_axis: int = 0) -> P:
    """Batch dimension over ('data', 'fsdp') when it divides, else replicated."""
    spec = [None] * len(shape)
    spec[batch_axis] = BATCH_AXES
    return _fit(spec, shape, mesh)


def inputs_shardings(inputs, mesh: Mesh):
    """Shardings for a ModelInputs pytree: text arrays and the images' patch rows split over the batch (a patch
    count that does not divide stays replicated)."""

    def one(a, batch_axis):
        return NamedSharding(mesh, batch_spec(mesh, a.shape, batch_axis))

    vision = None if inputs.vision is None else jax.tree.map(lambda a: one(a, 0), inputs.vision)
    return ModelInputs(
        input_ids=one(inputs.input_ids, 0),
        attention_mask=one(inputs.attention_mask, 0),
        positions=one(inputs.positions, 1),
        rope_deltas=one(inputs.rope_deltas, 0),
        vision=vision,
    )


def cache_shardings(cfg: Qwen2VLConfig, mesh: Mesh, batch: int, size: int):
    """KVCache shardings: batch over ('data', 'fsdp'), KV heads over 'tensor' when they divide."""
    t = cfg.text
    kv_shape = (t.num_hidden_layers, batch, size, t.num_key_value_heads, t.head_dim)
    kv = NamedSharding(mesh, _fit((None, BATCH_AXES, None, "tensor", None), kv_shape, mesh))
    vec = NamedSharding(mesh, batch_spec(mesh, (batch,)))
    return KVCache(k=kv, v=kv, length=vec, next_pos=vec)
