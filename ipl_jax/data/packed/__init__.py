"""Datasets packed once into ArrayRecord shards of step records, read back through Grain.

``encoding`` (the bytes of one step record), ``layout`` (shard names, the metadata file, per-process shares),
``writer`` (``pack_dataset``: any supported format -> shards), ``reader`` (``open_split`` for Grain pipelines,
``load_packed`` for whole splits of episodes).
"""

from ipl_jax.data.packed.layout import METADATA_FILE, is_packed, read_metadata
from ipl_jax.data.packed.reader import PackedSplit, RecordImage, load_packed, load_packed_with_report, open_split
from ipl_jax.data.packed.writer import pack_dataset, write_packed

__all__ = [
    "METADATA_FILE",
    "is_packed",
    "read_metadata",
    "PackedSplit",
    "RecordImage",
    "load_packed",
    "load_packed_with_report",
    "open_split",
    "pack_dataset",
    "write_packed",
]
