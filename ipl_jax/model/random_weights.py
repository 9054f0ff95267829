"""Random weights of a Qwen2-VL architecture, drawn (as ``params.init_params``) and written to safetensors one
tensor at a time, so host memory peaks at one shard.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import param_layout
from ipl_jax.model.weights import hf_shape, stored_name, write_safetensors


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _draw(key: jax.Array, shape: tuple[int, ...], init: str, dtype: str, std: float) -> jax.Array:
    if init == "normal":
        return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return jnp.full(shape, 1.0 if init == "ones" else 0.0, dtype)


def random_hf_tensors(
    cfg: Qwen2VLConfig, key: jax.Array, dtype: str = "bfloat16", std: float = 0.02
) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, array) of every tensor of ``cfg``'s checkpoint, drawn one at a time in the file's layout."""
    dtype = jnp.dtype(dtype).name
    for name, shape, init, key_path in _tensors(cfg):
        k = key
        for x in key_path:
            k = jax.random.fold_in(k, x)
        yield name, np.asarray(_draw(k, shape, init, dtype, std))


def hf_tensor_shapes(cfg: Qwen2VLConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor ``random_hf_tensors`` writes, without drawing anything."""
    return [(name, shape) for name, shape, _, _ in _tensors(cfg)]


def _tensors(cfg: Qwen2VLConfig):
    """(stored name, HF shape, init, key path: leaf index and layer) of every tensor, in ``param_layout`` order."""
    for j, ent in enumerate(param_layout(cfg)):
        shape = hf_shape(ent, cfg)
        if ent.stacked:
            for i in range(ent.shape[0]):
                yield stored_name(ent.hf_name.format(i=i), cfg), shape, ent.init, (j, i)
        else:
            yield stored_name(ent.hf_name, cfg), shape, ent.init, (j,)


def write_random_weights(
    out_dir: str,
    cfg: Qwen2VLConfig,
    key: jax.Array,
    dtype: str = "bfloat16",
    std: float = 0.02,
    max_shard_bytes: int = 4 << 30,
) -> int:
    """Draw and write the safetensors of ``cfg`` (``config.json`` is the caller's); returns the bytes written."""
    return write_safetensors(random_hf_tensors(cfg, key, dtype, std), out_dir, max_shard_bytes)
