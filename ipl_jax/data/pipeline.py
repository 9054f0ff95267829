"""The Grain input pipeline: shuffled, repeated, transformed, batched examples with a resumable iterator.

``source`` is any random-access sequence (a list of ``records.Step``, a grain data source, ...). The
pipeline is index based (``grain.MapDataset``), so the whole position of an iterator is one integer:

    source[shard_index::shard_count] -> shuffle(seed, reshuffled every epoch) -> repeat(num_epochs)
      -> map(transform) -> batch(batch_size, drop_remainder) -> threads + prefetch -> iterator

* ``transform(example) -> pytree of fixed-shape numpy arrays`` runs lazily in the reading threads, so a step's
  screenshot is opened only when its batch is about to be used (e.g. ``step.load_image()`` inside it).
* Epochs are concatenated before batching: a batch may straddle an epoch boundary and only the final partial
  batch of the whole run is dropped, so every example is seen exactly ``num_epochs`` times up to that tail.
* ``iterator.get_state()`` is a small JSON-able dict (``{"next_index": k}``); ``restore_iterator`` puts a
  fresh iterator of the same pipeline back at that batch. ``checkpoint_save_args`` / ``checkpoint_restore_args``
  give Orbax arguments (grain's own ``CheckpointHandler``) so that a training checkpoint made with
  ``ocp.args.Composite(..., data=checkpoint_save_args(it))`` carries the data position.
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
    """A batched ``grain.MapDataset`` over ``source``; ``len()`` of it is the number of batches.

    Args:
      source: random-access examples (``__len__`` and ``__getitem__``), e.g. a list of ``records.Step``.
      transform: one example -> a pytree of numpy arrays with the same shapes for every example; None passes
        the source's items to ``batch_fn`` as they are (e.g. a batch_fn that builds only some of a batch's rows).
      batch_size: examples per batch B; leaves of a batch get a leading axis B (``float32[B, ...]``).
      seed: shuffle seed in [0, 2**32); each epoch is shuffled differently, deterministically.
      num_epochs: passes over the source; None repeats forever.
      batch_fn: replaces grain's stacking (e.g. a collate that pads to shape buckets).
      shard_index, shard_count: this process's slice of the source (``jax.process_index()`` / ``_count()``).
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
    """An iterator over ``dataset`` whose transforms run in ``num_threads`` threads, keeping at most
    ``prefetch_buffer_size`` batches ahead (so at most that many batches' images are in memory)."""
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
