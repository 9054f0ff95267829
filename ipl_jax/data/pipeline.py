"""The Grain input pipeline: shuffled, repeated, transformed, batched examples with a resumable iterator.

Epochs are concatenated before batching (only the final partial batch is dropped); ``transform`` runs lazily
in the reading threads; an iterator's position is ``{"next_index": k}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grain
import grain.checkpoint
import orbax.checkpoint as ocp


def make_dataset(
    source: Sequence,
    transform: Callable[[Any], Any] | None,
    *,
    batch_size: int,
    seed: int,
    num_epochs: int | None = 1,
    shuffle: bool = True,
    drop_remainder: bool = True,
    batch_fn: Callable[[Sequence[Any]], Any] | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.MapDataset:
    """A batched ``grain.MapDataset`` over ``source``; its ``len()`` is the number of batches.

    transform: example -> fixed-shape numpy pytree (None: items go to ``batch_fn`` as they are); seed in
    [0, 2**32), reshuffled per epoch; num_epochs None repeats forever; shard_index / shard_count: this process's slice.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if len(source) == 0:
        raise ValueError("the pipeline source is empty")
    ds = grain.MapDataset.source(source)
    if shard_count > 1:
        ds = ds[shard_index::shard_count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    if transform is not None:
        ds = ds.map(transform)
    return ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)


def make_iterator(
    dataset: grain.MapDataset, *, num_threads: int = 2, prefetch_buffer_size: int = 4
) -> grain.DatasetIterator:
    """An iterator over ``dataset`` with transforms in ``num_threads`` threads and at most ``prefetch_buffer_size``
    batches ahead."""
    options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch_buffer_size)
    return iter(dataset.to_iter_dataset(options))


def num_batches(
    num_examples: int,
    *,
    batch_size: int,
    num_epochs: int = 1,
    drop_remainder: bool = True,
    shard_index: int = 0,
    shard_count: int = 1,
) -> int:
    """How many batches ``make_dataset`` yields for a finite number of epochs."""
    per_shard = len(range(shard_index, num_examples, shard_count))
    total = per_shard * num_epochs
    return total // batch_size if drop_remainder else math.ceil(total / batch_size)


def iterator_state(iterator: grain.DatasetIterator) -> dict:
    """The iterator's position: a small JSON-able dict."""
    return iterator.get_state()


def restore_iterator(iterator: grain.DatasetIterator, state: dict) -> grain.DatasetIterator:
    """Move a fresh iterator of the same pipeline to ``state``; returns it."""
    iterator.set_state(state)
    return iterator


def checkpoint_save_args(iterator: grain.DatasetIterator):
    """Orbax save arguments for the iterator (an item of ``ocp.args.Composite``)."""

    return grain.checkpoint.CheckpointSave(iterator)


def checkpoint_restore_args(iterator: grain.DatasetIterator):
    """Orbax restore arguments: restoring sets ``iterator`` (a fresh one of the same pipeline) in place."""

    return grain.checkpoint.CheckpointRestore(iterator)


def save_iterator(directory: str | Path, iterator: grain.DatasetIterator) -> None:
    """Write the iterator's position under ``directory`` with Orbax and grain's handler."""

    with ocp.Checkpointer(grain.checkpoint.CheckpointHandler()) as ckpt:
        ckpt.save(Path(directory).absolute(), args=checkpoint_save_args(iterator))


def load_iterator(directory: str | Path, iterator: grain.DatasetIterator) -> grain.DatasetIterator:
    """Restore a position written by ``save_iterator`` into a fresh iterator of the same pipeline."""

    with ocp.Checkpointer(grain.checkpoint.CheckpointHandler()) as ckpt:
        return ckpt.restore(Path(directory).absolute(), args=checkpoint_restore_args(iterator))
