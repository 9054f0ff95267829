"""LoRA adapters over a nested-dict parameter pytree: W' = W + (alpha / r) · A @ B for targets matched by regex
(leading axes stacked layers), A ~ U(±1/√in), B = 0.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

# Default targets for the Qwen2-VL layout (ipl_jax/model): attention and MLP kernels of the text decoder.
# Vision targets are opt-in (add VISION_TARGETS), matching the paper's warm-up SFT with a LoRA on the LLM.
# On a Qwen3-VL-MoE these match the attention projections only: the experts' tensors (mlp/experts/gate_up_proj
# [L, E, hidden, 2I], down_proj [L, E, I, hidden]) are opt-in (add EXPERT_TARGETS: an adapter per expert, E times
# a dense MLP's adapters) and the router (mlp/gate/kernel [L, hidden, E]) is never adapted (E columns: a rank-r
# update saves nothing over the router itself).
LANGUAGE_TARGETS = (r"^model/layers/.*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)/kernel$",)
VISION_TARGETS = (r"^visual/blocks/.*(qkv|proj|fc1|fc2)/kernel$",)
EXPERT_TARGETS = (r"^model/layers/mlp/experts/(gate_up_proj|down_proj)$",)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank r, alpha (scale = alpha / r), target regexes over '/'-joined param paths, adapter dtype."""

    rank: int = 128
    alpha: float = 256.0
    targets: tuple[str, ...] = LANGUAGE_TARGETS
    dtype: Any = jnp.float32

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_of_rank(rank: int) -> LoraConfig:
    """The job's adapters of rank ``rank``: alpha = 2 x rank (scale 2 whatever the rank)."""
    return LoraConfig(rank=rank, alpha=float(2 * rank))


@struct.dataclass
class LoraParams:
    """adapters: nested dict mirroring the base tree, target leaf -> {'a': [..., in, r], 'b': [..., r, out]}."""

    adapters: dict
    scale: float = struct.field(pytree_node=False)

    @property
    def rank(self) -> int:
        a = jax.tree.leaves(self.adapters)[0]
        return int(a.shape[-1])


# -------------------------------------------------------------------------------------------------- paths


def key_name(key) -> str:
    """One pytree key as text: dict keys, attribute names and sequence indices."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_str(path: Sequence[Any]) -> str:
    """A pytree key path as a '/'-joined string."""
    return "/".join(key_name(k) for k in path)


def flatten_with_paths(tree) -> dict[str, Any]:
    """{'/'-joined path: leaf} in tree order."""
    return {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _set_nested(tree: dict, path: Sequence[str], value) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def select_targets(base_params, targets: Sequence[str]) -> list[str]:
    """Paths of base params matching any target regex. Raises if a regex matches nothing or a non-matrix leaf."""
    paths = flatten_with_paths(base_params)
    chosen: list[str] = []
    for pattern in targets:
        regex = re.compile(pattern)
        hits = [p for p in paths if regex.search(p)]
        if not hits:
            sample = ", ".join(list(paths)[:8])
            raise ValueError(f"LoRA target {pattern!r} matches no parameter (paths look like: {sample}, ...)")
        for p in hits:
            if paths[p].ndim < 2:
                raise ValueError(
                    f"LoRA target {pattern!r} matches {p} with shape {paths[p].shape}; need [..., in, out]"
                )
            if p not in chosen:
                chosen.append(p)
    return chosen


# ---------------------------------------------------------------------------------------------- adapters


def init_lora(base_params, config: LoraConfig, rng: jax.Array) -> LoraParams:
    """Adapters for every target of ``base_params``: A ~ U(±1/√in) [..., in, r], B = 0 [..., r, out]."""
    paths = flatten_with_paths(base_params)
    chosen = select_targets(base_params, config.targets)
    adapters: dict = {}
    keys = jax.random.split(rng, len(chosen))
    for key, path in zip(keys, chosen):
        w = paths[path]
        *lead, d_in, d_out = w.shape
        bound = 1.0 / math.sqrt(d_in)
        a = jax.random.uniform(key, (*lead, d_in, config.rank), config.dtype, -bound, bound)
        b = jnp.zeros((*lead, config.rank, d_out), config.dtype)
        _set_nested(adapters, path.split("/"), {"a": a, "b": b})
    return LoraParams(adapters=adapters, scale=config.scale)


def lora_delta(adapter: dict, scale: float) -> jax.Array:
    """scale · A @ B, batched over leading (layer) axes. -> [..., in, out] in the adapter dtype."""
    return scale * jnp.matmul(adapter["a"], adapter["b"], precision=jax.lax.Precision.HIGHEST)


def apply_lora(base_params, lora_params: LoraParams):
    """Base params with every adapted leaf replaced by W + scale·A@B (in W's dtype). Pure; differentiable."""
    flat = flatten_with_paths(lora_params.adapters)
    adapter_paths = {p.rsplit("/", 1)[0] for p in flat}

    def merge(path, w):
        name = path_str(path)
        if name not in adapter_paths:
            return w
        adapter = {"a": flat[f"{name}/a"], "b": flat[f"{name}/b"]}
        delta = lora_delta(adapter, lora_params.scale)
        return (w.astype(jnp.promote_types(w.dtype, delta.dtype)) + delta).astype(w.dtype)

    merged = jax.tree_util.tree_map_with_path(merge, base_params)
    missing = adapter_paths - set(flatten_with_paths(base_params))
    if missing:
        raise ValueError(f"LoRA adapters for parameters the base tree lacks: {sorted(missing)[:5]}")
    return merged


def attach_lora(base_params, lora_params: LoraParams):
    """Base params with each stacked adapter beside its kernel as ``lora_a`` / ``lora_b`` (scale folded into b), merged
    per layer by ``model.layers.dense``; unstacked targets merged here. Same values as ``apply_lora``."""
    flat = flatten_with_paths(lora_params.adapters)
    stacked = {p.rsplit("/", 1)[0] for p in flat if flat[p].ndim > 2 and p.endswith("/kernel/a")}
    merged = apply_lora(base_params, _only(lora_params, exclude=stacked))
    out = jax.tree.map(lambda x: x, merged)  # a fresh nested dict to add leaves to
    for target in stacked:
        node = out
        for part in target.rsplit("/", 1)[0].split("/"):
            node = node[part]
        node["lora_a"] = flat[f"{target}/a"]
        node["lora_b"] = lora_params.scale * flat[f"{target}/b"]
    return out


def _only(lora_params: LoraParams, exclude) -> LoraParams:
    adapters: dict = {}
    for path, leaf in flatten_with_paths(lora_params.adapters).items():
        if path.rsplit("/", 1)[0] not in exclude:
            _set_nested(adapters, path.split("/"), leaf)
    return LoraParams(adapters=adapters, scale=lora_params.scale)


@jax.jit
def merge_lora(base_params, lora_params: LoraParams):
    """Fold the adapters into the base weights for export (same math as ``apply_lora``, jitted)."""
    return apply_lora(base_params, lora_params)


def lora_shardings(lora_params: LoraParams, base_shardings):
    """Adapter shardings from the base kernels' NamedShardings: A [..., in, r] takes the leading and ``in`` entries,
    B [..., r, out] the leading and ``out`` entries; r unsharded.
    """
    base = flatten_with_paths(base_shardings)

    def one(path, leaf):
        name = path_str(path)
        target, which = name.rsplit("/", 1)
        sharding = base[target]
        spec = tuple(sharding.spec) + (None,) * (leaf.ndim - len(tuple(sharding.spec)))
        lead = spec[:-2]
        new = (*lead, spec[-2], None) if which == "a" else (*lead, None, spec[-1])
        return NamedSharding(sharding.mesh, PartitionSpec(*new))

    adapters = jax.tree_util.tree_map_with_path(one, lora_params.adapters)
    return LoraParams(adapters=adapters, scale=lora_params.scale)
