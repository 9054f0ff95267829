"""Reading a dataset split in any supported published format (the readers are imported on demand)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Optional

from ipl_jax.data.records import Episode

# format -> (module, loader); each loader is ``load(root, split) -> list[Episode]``.
LOADERS = {
    "aitz": ("ipl_jax.data.aitz", "load_aitz"),
    "amex": ("ipl_jax.data.amex", "load_amex"),
    "androidcontrol": ("ipl_jax.data.android_control", "load_android_control"),
}


def load_dataset(root: str | Path, fmt: str, split: Optional[str]) -> list[Episode]:
    """The episodes of one split of a dataset in format ``fmt`` (imports the reader on demand).

    AMEX has no published splits: ``split`` None (or "all") reads every episode file.
    """
    if fmt not in LOADERS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(LOADERS)}")
    module, name = LOADERS[fmt]
    if fmt == "amex" and split == "all":
        split = None
    return getattr(importlib.import_module(module), name)(root, split)


def dataset_steps(data: str | Path, fmt: str, split: Optional[str], limit: Optional[int] = None):
    """(episodes, their steps in order, at most ``limit``) of a dataset split."""
    episodes = load_dataset(data, fmt, split)
    steps = [s for ep in episodes for s in ep.steps]
    return episodes, (steps if limit is None else steps[:limit])
