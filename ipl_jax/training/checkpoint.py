"""Training checkpoints with Orbax: per step ``state`` (restored bit-exact against a template), ``data``
(iterator state) and ``meta``; asynchronous saves, the last ``keep`` kept, a killed save never corrupts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from ipl_jax import storage
from ipl_jax.training.lora import LoraParams, merge_lora
from ipl_jax.training.state import merge_trees

_BYTES_TAG = "__utf8_bytes__"


class Checkpointer:
    """Save / restore TrainStates (+ data-iterator state + run metadata) in ``directory``."""

    def __init__(
        self, directory: str | os.PathLike, *, save_every: int = 100, keep: int | None = 3, async_save: bool = True
    ):
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        self.directory = storage.absolute(directory)  # a gs:// URI stays one: Orbax writes there directly
        self.save_every = int(save_every)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data", "meta"))

    # ---------------------------------------------------------------------------------------------- queries

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    # ------------------------------------------------------------------------------------------------- save

    def save(
        self,
        step: int,
        state,
        *,
        data_state: Any = None,
        metadata: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        """Save if ``step`` is a multiple of ``save_every`` (or ``force``) and not already saved; returns whether it
        started.
        """
        step = int(step)
        if (step % self.save_every and not force) or step in self._manager.all_steps():
            return False
        meta = {"step": step, **(dict(metadata) if metadata else {})}
        scale = _lora_scale(state)
        if scale is not None:
            meta["lora_scale"] = scale  # static in the pytree, so not in the arrays: needed to merge without a template
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(_encode_data_state(data_state)),
            meta=ocp.args.JsonSave(meta),
        )
        # The schedule is decided above (orbax's own policy would also save the very first step it sees).
        return bool(self._manager.save(step, args=args, force=True))

    def wait(self) -> None:
        """Block until pending asynchronous saves are complete on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    # ---------------------------------------------------------------------------------------------- restore

    def _step_or_latest(self, step: int | None) -> int:
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        return int(step)

    def restore(self, template, step: int | None = None) -> tuple[Any, Any, dict]:
        """(state, data_state, metadata) of ``step`` (default latest); ``template``: a TrainState of arrays or
        ``ShapeDtypeStruct``s. FileNotFoundError if there is none.
        """
        step = self._step_or_latest(step)
        abstract = jax.tree.map(_abstract_leaf, template)
        restored = self._manager.restore(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract),
                data=ocp.args.JsonRestore(),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], _decode_data_state(restored["data"]), dict(restored["meta"])

    def load_model_params(self, step: int | None = None) -> tuple[dict, dict]:
        """(full model params, metadata) of a checkpoint without a template (for export): trainable and frozen
        rejoined, or LoRA merged with the recorded scale. Needs host memory for the whole state.
        """
        step = self._step_or_latest(step)
        restored = self._manager.restore(
            int(step), args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
        )
        state, meta = restored["state"], dict(restored["meta"])
        trainable, frozen = state["params"], state.get("frozen") or {}
        if "lora_scale" in meta:
            params = merge_lora(frozen, LoraParams(adapters=trainable["adapters"], scale=float(meta["lora_scale"])))
        else:
            params = merge_trees(trainable, frozen) if frozen else trainable
        return params, meta

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _lora_scale(state) -> float | None:
    params = getattr(state, "params", None)
    return float(params.scale) if isinstance(params, LoraParams) else None


def _abstract_leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    return ocp.utils.to_shape_dtype_struct(x)


def _encode_data_state(data_state: Any) -> dict:
    if isinstance(data_state, (bytes, bytearray)):
        return {"value": {_BYTES_TAG: bytes(data_state).decode("utf-8")}}
    return {"value": data_state}


def _decode_data_state(stored: Any) -> Any:
    value = stored.get("value") if isinstance(stored, dict) else stored
    if isinstance(value, dict) and set(value) == {_BYTES_TAG}:
        return value[_BYTES_TAG].encode("utf-8")
    return value
