"""Reading a dataset split in any supported published format (the readers are imported on demand)."""

from __future__ import annotations

import collections
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ipl_jax.data.packed.layout import check_packed_format, read_metadata

if TYPE_CHECKING:  # records imports PIL; the job's settings read this module's names without it
    from ipl_jax.data.records import Episode

# format -> (module, loader); each loader is ``load(root, split) -> list[Episode]``.
LOADERS = {
    "aitz": ("ipl_jax.data.aitz", "load_aitz"),
    "amex": ("ipl_jax.data.amex", "load_amex"),
    "androidcontrol": ("ipl_jax.data.android_control", "load_android_control"),
    "arrayrecord": ("ipl_jax.data.packed.reader", "load_packed"),  # shards written by `ipl-jax pack-data`
}
TFDS_PREFIX = "tfds:"  # "tfds:NAME": a prepared TensorFlow Datasets dataset, read with tfds.data_source
ALIASES = {"android_control": "androidcontrol"}  # other spellings a reader accepts (data.action_format)


def canonical_format(fmt: str) -> str:
    """``fmt`` under the name ``LOADERS`` knows it by (``android_control`` -> ``androidcontrol``)."""
    return ALIASES.get(fmt, fmt)


def scoring_format(fmt: str, root) -> str:
    """The format whose metric rules apply to data read as ``fmt`` from ``root`` (packed / TFDS: from metadata;
    synthetic: AITZ)."""
    if fmt == "synthetic":
        return "aitz"
    if fmt.startswith(TFDS_PREFIX):  # the optional tfds extra, imported only for tfds:NAME data
        from ipl_jax.data.tfds.source import tfds_scoring_format

        return tfds_scoring_format(fmt[len(TFDS_PREFIX) :], root)
    if fmt == "arrayrecord" or _packed_dir(root):
        return read_metadata(root)["scoring_format"]
    return fmt


def _packed_dir(root) -> bool:
    """Whether ``root`` was written by ``ipl-jax pack-data`` (checked without importing the packed reader)."""
    try:
        return (Path(root) / "ipl_jax_arrayrecord.json").is_file()
    except (TypeError, OSError):
        return False


def load_dataset_with_report(
    root: str | Path, fmt: str, split: str | None, skip_bad: bool = False
) -> tuple[list[Episode], list]:
    """(episodes, skipped records) of one split; a malformed record raises ``DataError`` unless ``skip_bad``."""
    if fmt.startswith(TFDS_PREFIX):  # the optional tfds extra (see scoring_format)
        from ipl_jax.data.tfds.source import load_tfds_with_report

        return load_tfds_with_report(fmt[len(TFDS_PREFIX) :], root, split, skip_bad=skip_bad)
    fmt = canonical_format(fmt)
    if fmt not in LOADERS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(LOADERS)}, {TFDS_PREFIX}NAME")
    if fmt != "arrayrecord" and _packed_dir(root):  # auto-detected: a directory written by `ipl-jax pack-data`
        check_packed_format(root, fmt)
        fmt = "arrayrecord"
    module, name = LOADERS[fmt]
    if fmt == "amex" and split == "all":
        split = None
    return getattr(importlib.import_module(module), f"{name}_with_report")(root, split, skip_bad=skip_bad)


def load_dataset(root: str | Path, fmt: str, split: str | None, skip_bad: bool = False) -> list[Episode]:
    """The episodes of one split in format ``fmt``; for AMEX, ``split`` None (or "all") reads every episode file."""
    return load_dataset_with_report(root, fmt, split, skip_bad)[0]


def skipped_summary(skipped: Sequence, where: str) -> str:
    """One line: how many malformed records were skipped in ``where`` and why, the first one in full."""
    by_field = collections.Counter(getattr(e, "field", "?") for e in skipped)
    reasons = ", ".join(f"{field}: {n}" for field, n in by_field.most_common())
    return (
        f"skipped {len(skipped)} malformed record{'s' * (len(skipped) != 1)} in {where} (by field: {reasons}); "
        f"first: {skipped[0]}"
    )


def dataset_steps(data: str | Path, fmt: str, split: str | None, limit: int | None = None, skip_bad: bool = False):
    """(episodes, their steps in order, at most ``limit``) of a dataset split."""
    episodes = load_dataset(data, fmt, split, skip_bad)
    steps = [s for ep in episodes for s in ep.steps]
    return episodes, (steps if limit is None else steps[:limit])
