"""TrainState: what a trainer carries between steps, its creation (all trained, a frozen subset, or LoRA) and its
shardings.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax.model.sharding import param_shardings
from ipl_jax.training.lora import (
    LoraConfig,
    LoraParams,
    apply_lora,
    attach_lora,
    flatten_with_paths,
    init_lora,
    lora_shardings,
)

VISION_REGEX = r"^visual/"


@struct.dataclass
class TrainState:
    """step: int32[]; params: trainable pytree (or LoraParams); frozen: pytree ({} if none);
    opt_state: optimizer state of ``params``; rng: uint32[2] raw PRNG key (split once per step)."""

    step: jax.Array
    params: Any
    frozen: Any
    opt_state: Any
    rng: jax.Array


@dataclasses.dataclass(frozen=True)
class Precision:
    """compute: the model's compute dtype; storage: the dtype of untrained weights (sampler, reference, frozen base);
    remat: the training programs' policy. Trained weights and moments are always float32."""

    compute: str
    storage: str
    remat: str

    @property
    def compute_dtype(self) -> str | None:
        """What a training step casts the fp32 master weights to (None: float32, read as they are)."""
        return None if self.compute == "float32" else self.compute

    @property
    def frozen_dtype(self) -> str | None:
        """What a training state keeps its frozen weights in (None: float32, kept as loaded)."""
        return None if self.storage == "float32" else self.storage


# ------------------------------------------------------------------------------------------------ params


def split_params(params: dict, frozen_regex: str | None) -> tuple[dict, dict]:
    """(trainable, frozen) nested dicts: leaves whose '/'-path matches ``frozen_regex`` go to frozen."""
    if not frozen_regex:
        return params, {}
    regex = re.compile(frozen_regex)
    trainable: dict = {}
    frozen: dict = {}
    for path, leaf in flatten_with_paths(params).items():
        node = frozen if regex.search(path) else trainable
        parts = path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = leaf
    if not frozen:
        raise ValueError(f"freeze regex {frozen_regex!r} matches no parameter")
    return trainable, frozen


def merge_trees(a: dict, b: dict) -> dict:
    """Deep union of two nested dicts with disjoint leaves (used to rejoin trainable and frozen params)."""
    out = dict(a)
    for key, value in b.items():
        if key in out:
            if not (isinstance(out[key], dict) and isinstance(value, dict)):
                raise ValueError(f"parameter {key!r} is both trainable and frozen")
            out[key] = merge_trees(out[key], value)
        else:
            out[key] = value
    return out


def model_params(trainable, frozen):
    """The full parameter tree the model reads: LoRA merged on the fly, or trainable ∪ frozen."""
    if isinstance(trainable, LoraParams):
        return apply_lora(frozen, trainable)
    if not frozen:
        return trainable
    return merge_trees(trainable, frozen)


def loss_params(trainable, frozen, compute_dtype=None):
    """The tree a training loss reads: trainable ∪ frozen cast to ``compute_dtype`` (None: as stored); with LoRA the
    fp32 adapters attached beside their kernels."""
    if isinstance(trainable, LoraParams):
        base = frozen if compute_dtype is None else cast_floating(frozen, compute_dtype)
        return attach_lora(base, trainable)
    params = model_params(trainable, frozen)
    return params if compute_dtype is None else cast_floating(params, compute_dtype)


def cast_floating(tree, dtype):
    """Cast every floating leaf to ``dtype`` (integer leaves untouched)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


# ------------------------------------------------------------------------------------------------ creation


def create_train_state(
    params,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    *,
    freeze_regex: str | None = None,
    lora: LoraConfig | None = None,
    frozen_dtype=None,
) -> TrainState:
    """A fresh TrainState: with ``lora`` every base param frozen, else leaves matching ``freeze_regex`` frozen.
    ``rng``: a raw uint32[2] key."""
    rng = jnp.array(rng)  # a copy: steps donate the state, and the caller's key must outlive that
    # Weakly typed leaves (e.g. from jnp.full(shape, 0.1)) would come back strongly typed from the first step and
    # make the second call compile again.
    params = jax.tree.map(lambda x: jnp.asarray(x, x.dtype) if getattr(x, "weak_type", False) else x, params)
    if lora is not None:
        rng, lora_rng = jax.random.split(rng)
        trainable, frozen = jax.jit(init_lora, static_argnums=1)(params, lora, lora_rng), params
    else:
        trainable, frozen = split_params(params, freeze_regex)
    if frozen_dtype is not None and frozen:
        frozen = cast_floating(frozen, frozen_dtype)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=trainable,
        frozen=frozen,
        opt_state=jax.jit(optimizer.init)(trainable),  # jitted: one compile instead of one per leaf shape
        rng=rng,
    )


def train_state_shardings(state: TrainState, optimizer, mesh, params_shardings, frozen_shardings) -> TrainState:
    """TrainState of NamedShardings: moments follow their params, the rest replicated. ``state`` may be abstract."""
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        state.opt_state,
        params_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    return TrainState(
        step=replicated,
        params=params_shardings,
        frozen=frozen_shardings,
        opt_state=opt_shardings,
        rng=replicated,
    )


def state_shardings(state: TrainState, optimizer, mesh) -> TrainState:
    """NamedShardings of a TrainState by the model's partition rules (adapters follow their kernels, moments their
    params, the rest replicated). ``state`` may be abstract."""
    frozen_sh = param_shardings(state.frozen, mesh) if state.frozen else {}
    if isinstance(state.params, LoraParams):
        params_sh = lora_shardings(state.params, frozen_sh)
    else:
        params_sh = param_shardings(state.params, mesh)
    return train_state_shardings(state, optimizer, mesh, params_sh, frozen_sh)
