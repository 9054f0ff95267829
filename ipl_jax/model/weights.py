"""Hugging Face safetensors in and out: ``load_params`` (either tensor naming, tied ``lm_head``, each device's
shard read straight from the file) and ``save_params`` (on-disk names, (out, in) kernels).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import ParamEntry, get_path, param_layout, set_path

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def canonical_name(name: str) -> str:
    """transformers>=4.52 in-memory names -> on-disk ones (model.language_model.* -> model.*, model.visual.*)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    if name.startswith("model.visual."):
        return name[len("model.") :]
    return name


def stored_name(name: str, cfg: Qwen2VLConfig) -> str:
    """The name ``save_params`` writes for a canonical ``name``: the on-disk names transformers reads for the
    family; Qwen3-VL (no mapping from the older names in transformers) takes the in-memory ones."""
    if cfg.model_type != "qwen3_vl":
        return name
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model."):
        return "model.language_model." + name[len("model.") :]
    return name


class _TensorSource:
    """Open safetensors files of one checkpoint directory; tensors addressed by canonical name."""

    def __init__(self, model_dir: str):

        self.model_dir = model_dir
        index = os.path.join(model_dir, INDEX_FILE)
        single = os.path.join(model_dir, SINGLE_FILE)
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise ValueError(f"{index}: not a safetensors index ({e})") from None
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            files = [SINGLE_FILE]
        else:
            raise FileNotFoundError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE}")
        self._handles = {}
        self.where: dict[str, tuple[str, str]] = {}  # canonical name -> (file, stored name)
        for fn in files:
            path = os.path.join(model_dir, fn)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path}: listed in {INDEX_FILE} but missing")
            h = safe_open(path, framework="numpy")
            self._handles[fn] = h
            for stored in h.keys():
                self.where[canonical_name(stored)] = (fn, stored)

    def has(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple[int, ...]:
        fn, stored = self._lookup(name)
        return tuple(self._handles[fn].get_slice(stored).get_shape())

    def read(self, name: str, index: tuple = ()) -> np.ndarray:
        """The stored tensor (or a basic-slice ``index`` of it) as numpy."""
        fn, stored = self._lookup(name)
        sl = self._handles[fn].get_slice(stored)
        return np.asarray(sl[index] if index else sl[:])

    def _lookup(self, name: str) -> tuple[str, str]:
        try:
            return self.where[name]
        except KeyError:
            raise KeyError(f"{self.model_dir}: tensor {name!r} not found in the checkpoint") from None


def hf_shape(ent: ParamEntry, cfg: Qwen2VLConfig) -> tuple[int, ...]:
    """The shape of ``ent``'s tensor (one layer's, when stacked) in the checkpoint's layout."""
    shape = ent.shape[1:] if ent.stacked else ent.shape
    if ent.transform == "linear":
        return (shape[1], shape[0])
    if ent.transform == "conv":
        v = cfg.vision
        return (shape[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    return shape


def expert_layout(stored: tuple[int, ...], ours: tuple[int, ...]) -> str:
    """How a stacked-experts tensor of shape ``stored`` holds ours (experts, in, out): 'transposed' when it has
    transformers-5's shape (experts, out, in) (a square one included, as transformers reads it), else 'copy' (the
    published checkpoints' layout, (experts, in, out)). ``save_params`` writes the published layout unless square."""
    return "transposed" if tuple(stored) == (ours[0], ours[2], ours[1]) else "copy"


def _read_unstacked(src: _TensorSource, ent: ParamEntry, name: str, index: tuple) -> np.ndarray:
    """Reads our-layout slice ``index`` (one slice per our dim) of one per-layer (or unstacked) tensor."""
    if ent.transform == "experts" and expert_layout(src.shape(name), hf_shape(ent, None)) == "transposed":
        e, a, b = index if index else (slice(None),) * 3
        return src.read(name, (e, b, a)).transpose(0, 2, 1)
    if ent.transform in ("copy", "experts"):
        return src.read(name, index)
    if ent.transform == "linear":
        a, b = index if index else (slice(None), slice(None))
        return src.read(name, (b, a)).T
    # conv: ours [CTPP, E] = W.reshape(E, -1).T ; slice E on the file, the flattened axis after reshaping.
    a, b = index if index else (slice(None), slice(None))
    w = src.read(name, (b,))
    return w.reshape(w.shape[0], -1).T[a]


def _leaf_reader(src: _TensorSource, ent: ParamEntry, name_fmt: str, dtype) -> Callable[[tuple], np.ndarray]:
    def read(index: tuple) -> np.ndarray:
        index = tuple(index) if index is not None else ()
        full = len(ent.shape)
        index = index + (slice(None),) * (full - len(index))
        if ent.stacked:
            layers = range(ent.shape[0])[index[0]]
            parts = [_read_unstacked(src, ent, name_fmt.format(i=i), index[1:]) for i in layers]
            arr = np.stack(parts, axis=0) if parts else np.zeros((0,) + ent.shape[1:])
        else:
            arr = _read_unstacked(src, ent, name_fmt, index)
        return np.ascontiguousarray(arr.astype(dtype))

    return read


def load_params(
    model_dir: str, cfg: Qwen2VLConfig | None = None, shardings: Any = None, dtype: Any = None
) -> tuple[dict, Qwen2VLConfig]:
    """Loads a Hugging Face Qwen2-VL checkpoint; returns (params, cfg). shardings: None, one ``Sharding``, or a
    pytree of them; dtype: leaf dtype (default ``cfg.param_dtype``, which follows it).
    """
    model_dir = os.fspath(model_dir)
    if cfg is None:
        cfg = Qwen2VLConfig.from_dir(model_dir)
    if dtype is not None:
        cfg = cfg.replace(param_dtype=jnp.dtype(dtype).name)
    np_dtype = jnp.dtype(cfg.param_dtype)
    src = _TensorSource(model_dir)
    if not cfg.tie_word_embeddings and not src.has("lm_head.weight"):
        cfg = cfg.replace(tie_word_embeddings=True)
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's own device
    params: dict = {}
    for ent in param_layout(cfg):
        names = [ent.hf_name.format(i=i) for i in range(ent.shape[0])] if ent.stacked else [ent.hf_name]
        want = hf_shape(ent, cfg)
        for n in names:
            got = src.shape(n)
            if got != want and not (ent.transform == "experts" and got == (want[0], want[2], want[1])):
                raise ValueError(f"{model_dir}: tensor {n!r} has shape {got}, config implies {want}")
        if shardings is None:
            sh = default
        elif isinstance(shardings, jax.sharding.Sharding):
            sh = shardings
        else:
            sh = get_path(shardings, ent.path)
        arr = jax.make_array_from_callback(ent.shape, sh, _leaf_reader(src, ent, ent.hf_name, np_dtype))
        set_path(params, ent.path, arr)
    return params, cfg


def _host_value(leaf) -> np.ndarray:
    """A leaf as numpy; one sharded over other processes' devices is all-gathered (a collective: all processes call)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and not leaf.is_fully_replicated:
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(leaf)


def _hf_tensors(params: dict, cfg: Qwen2VLConfig):
    """Yields (stored name, numpy array in HF layout), one per-layer tensor at a time."""
    for ent in param_layout(cfg):
        leaf = get_path(params, ent.path)
        if tuple(leaf.shape) != ent.shape:
            raise ValueError(f"param {ent.key} has shape {tuple(leaf.shape)}, config implies {ent.shape}")
        full = _host_value(leaf)
        items = (
            [(ent.hf_name.format(i=i), full[i]) for i in range(ent.shape[0])] if ent.stacked else [(ent.hf_name, full)]
        )
        for name, a in items:
            if ent.transform == "linear":
                a = a.T
            elif ent.transform == "experts" and a.shape[1] == a.shape[2]:  # square: transformers-5's layout
                a = a.transpose(0, 2, 1)
            elif ent.transform == "conv":
                v = cfg.vision
                a = a.T.reshape(a.shape[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
            yield stored_name(name, cfg), np.ascontiguousarray(a)


def save_params(params: dict, cfg: Qwen2VLConfig, out_dir: str, max_shard_bytes: int = 4 << 30) -> None:
    """Writes ``config.json`` and ``model.safetensors`` (or shards + ``model.safetensors.index.json`` when the
    model is larger than ``max_shard_bytes``) with on-disk HF names. Leaves are saved in their own dtype."""
    os.makedirs(out_dir, exist_ok=True)
    dtype_names = {jnp.dtype(get_path(params, e.path).dtype).name for e in param_layout(cfg)}
    save_cfg = cfg.replace(param_dtype=dtype_names.pop()) if len(dtype_names) == 1 else cfg
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(save_cfg.to_hf_dict(), f, indent=2)
    write_safetensors(_hf_tensors(params, cfg), out_dir, max_shard_bytes)


def write_safetensors(tensors, out_dir: str, max_shard_bytes: int = 4 << 30) -> int:
    """Writes (name, numpy array) pairs as ``model.safetensors``, or shards of at most ``max_shard_bytes`` plus an
    index. ``tensors`` may be a generator (one shard in memory at a time). Returns the bytes written."""

    os.makedirs(out_dir, exist_ok=True)
    written: list[tuple[str, list[str]]] = []  # (temporary file, tensor names), in order
    current: dict[str, np.ndarray] = {}
    size = 0

    def flush():
        tmp = os.path.join(out_dir, f".shard-{len(written):05d}.tmp")
        save_file(current, tmp, metadata={"format": "pt"})
        written.append((tmp, list(current)))

    for name, a in tensors:
        if current and size + a.nbytes > max_shard_bytes:
            flush()
            current, size = {}, 0
        current[name] = a
        size += a.nbytes
    flush()
    current = {}

    n = len(written)
    weight_map, total = {}, 0
    for j, (tmp, names) in enumerate(written):
        final = SINGLE_FILE if n == 1 else f"model-{j + 1:05d}-of-{n:05d}.safetensors"
        total += os.path.getsize(tmp)
        os.replace(tmp, os.path.join(out_dir, final))
        weight_map.update({name: final for name in names})
    index_path = os.path.join(out_dir, INDEX_FILE)
    if n > 1:
        with open(index_path, "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    else:
        if os.path.exists(index_path):
            os.remove(index_path)
    return total
