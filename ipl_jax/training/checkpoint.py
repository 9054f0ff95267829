"""Training checkpoints with orbax-checkpoint's CheckpointManager.

One checkpoint = one step directory of three items: ``state`` (the whole TrainState, restored bit-exact against a
template, with its dtypes and shardings), ``data`` (the data iterator's state as JSON) and ``meta`` (whatever the
caller passes). Saves happen every ``save_every`` steps and when forced, asynchronously; the last ``keep`` are
kept, and a run killed mid-save leaves the previous checkpoint intact (Orbax renames a finished step into place).

    ckpt = Checkpointer(run_dir / "checkpoints", save_every=100, keep=3)
    if ckpt.latest_step() is not None:
        state, data_state, meta = ckpt.restore(state)        # `state`: a freshly built (or abstract) template
    ckpt.save(step, state, data_state=it.get_state(), metadata={...}, force=last)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

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
        self.directory = os.path.abspath(os.fspath(directory))
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
        """Save if ``step`` is a multiple of ``save_every`` (or ``force``); returns whether a save started.

        A step that already has a checkpoint is not saved again (e.g. the final save of a resumed run).
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
        """(state, data_state, metadata) of ``step`` (default: the latest).

        ``template``: a TrainState with the right structure — concrete arrays or ``jax.ShapeDtypeStruct``s (with
        ``sharding`` set to place leaves on a mesh). Raises FileNotFoundError if there is no checkpoint.
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
        """(full model params, metadata) of a checkpoint without a template, e.g. for export to Hugging Face.

        Restores the saved TrainState as plain nested dicts (optimizer state included, so this needs host memory
        for the whole state), then rejoins trainable and frozen params or merges the LoRA adapters with the
        scale recorded in the metadata.
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
