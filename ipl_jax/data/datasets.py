"""Reading a dataset split in any supported published format (the readers are imported on demand)."""

from __future__ import annotations

import collections
import importlib
from pathlib import Path
from typing import Optional, Sequence

from ipl_jax.data.records import Episode

# format -> (module, loader); each loader is ``load(root, split) -> list[Episode]``.
LOADERS = {
    "aitz": ("ipl_jax.data.aitz", "load_aitz"),
    "amex": ("ipl_jax.data.amex", "load_amex"),
    "androidcontrol": ("ipl_jax.data.android_control", "load_android_control"),
}


def load_dataset_with_report(root: str | Path, fmt: str, split: Optional[str],
                             skip_bad: bool = False) -> tuple[list[Episode], list]:
    """(episodes, skipped records) of one split. Without ``skip_bad`` a malformed record raises ``DataError``;
    with it, the record is left out and listed (``skipped_summary`` says how many and why)."""
    if fmt not in LOADERS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(LOADERS)}")
    module, name = LOADERS[fmt]
    if fmt == "amex" and split == "all":
        split = None
    return getattr(importlib.import_module(module), f"{name}_with_report")(root, split, skip_bad=skip_bad)


def load_dataset(root: str | Path, fmt: str, split: Optional[str], skip_bad: bool = False) -> list[Episode]:
    """The episodes of one split of a dataset in format ``fmt`` (imports the reader on demand).

    AMEX has no published splits: ``split`` None (or "all") reads every episode file.
    """
    return load_dataset_with_report(root, fmt, split, skip_bad)[0]


def skipped_summary(skipped: Sequence, where: str) -> str:
    """One line: how many malformed records were skipped in ``where`` and why (counts by field), with the
    first one in full."""
    by_field = collections.Counter(getattr(e, "field", "?") for e in skipped)
    reasons = ", ".join(f"{field}: {n}" for field, n in by_field.most_common())
    return (f"skipped {len(skipped)} malformed record{'s' * (len(skipped) != 1)} in {where} (by field: {reasons}); "
            f"first: {skipped[0]}")


def dataset_steps(data: str | Path, fmt: str, split: Optional[str], limit: Optional[int] = None,
                  skip_bad: bool = False):
    """(episodes, their steps in order, at most ``limit``) of a dataset split."""
    episodes = load_dataset(data, fmt, split, skip_bad)
    steps = [s for ep in episodes for s in ep.steps]
    return episodes, (steps if limit is None else steps[:limit])
