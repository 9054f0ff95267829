"""Random weights of a Qwen2-VL architecture, drawn and written tensor by tensor.

``random_hf_tensors(cfg, key)`` yields (Hugging Face tensor name, numpy array in the HF layout) one tensor at a
time, in ``params.param_layout`` order: a stacked leaf [L, ...] is drawn layer by layer with the key
``fold_in(fold_in(key, leaf index), layer)``, so the largest array held is one tensor (the embedding). The init
is ``params.init_params``'s: normal(0, std) for kernels and embeddings, ones for norm scales, zeros for biases,
drawn in float32 on JAX's default device (an accelerator draws a 7B model in seconds) and cast to ``dtype``.
``write_random_weights(out_dir, cfg, key)`` streams them into safetensors shards (``weights.write_safetensors``),
so host memory peaks at one shard (4 GiB by default) whatever the model's size.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import param_layout
from ipl_jax.model.weights import hf_items, hf_shape, write_safetensors


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _draw(key: jax.Array, shape: tuple[int, ...], init: str, dtype: str, std: float) -> jax.Array:
    if init == "normal":
        return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return jnp.full(shape, 1.0 if init == "ones" else 0.0, dtype)


def random_hf_tensors(
    cfg: Qwen2VLConfig, key: jax.Array, dtype: str = "bfloat16", std: float = 0.02
) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, array) of every tensor of ``cfg``'s checkpoint, drawn one at a time (see the module doc)."""
    dtype = jnp.dtype(dtype).name
    for j, ent in enumerate(param_layout(cfg)):
        leaf_key = jax.random.fold_in(key, j)
        if ent.stacked:
            for i in range(ent.shape[0]):
                value = np.asarray(_draw(jax.random.fold_in(leaf_key, i), ent.shape[1:], ent.init, dtype, std))
                yield hf_items(ent, value, cfg, layer=i)
        else:
            yield hf_items(ent, np.asarray(_draw(leaf_key, ent.shape, ent.init, dtype, std)), cfg)


def hf_tensor_shapes(cfg: Qwen2VLConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor ``random_hf_tensors`` writes, without drawing anything."""
    out = []
    for ent in param_layout(cfg):
        names = [ent.hf_name.format(i=i) for i in range(ent.shape[0])] if ent.stacked else [ent.hf_name]
        out += [(name, hf_shape(ent, cfg)) for name in names]
    return out


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
