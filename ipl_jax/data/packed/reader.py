"""Reading packed datasets through Grain: ``open_split`` (random access to this process's steps) and
``load_packed`` (a whole split's episodes). Images are reread from their record when needed.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from pathlib import Path

from PIL import Image

from ipl_jax.data.packed.encoding import group_episodes, image_offset, split_record, step_from_header
from ipl_jax.data.packed.layout import METADATA_FILE, check_shards, process_files, read_metadata, split_info
from ipl_jax.data.records import DataError, Episode, Step

_CHUNK = 256  # records fetched per read while rebuilding episodes


@functools.lru_cache(maxsize=64)
def data_source(paths: tuple[str, ...]):
    """One ``grain.sources.ArrayRecordDataSource`` per tuple of shard paths, shared by the whole process."""
    import grain  # Grain (and JAX) load only when packed data is read: `ipl-jax score` starts without them

    return grain.sources.ArrayRecordDataSource(list(paths))


@dataclasses.dataclass(frozen=True)
class RecordImage:
    """``Step.image`` of a packed step: record ``key`` of the shards ``paths``, read on call (picklable)."""

    paths: tuple[str, ...]
    key: int

    def encoded(self) -> bytes:
        """The screenshot's PNG/JPEG bytes."""
        payload = data_source(self.paths)[self.key]
        return payload[image_offset(payload) :]

    def __call__(self):

        return Image.open(io.BytesIO(self.encoded()))


class PackedSplit:
    """Decoded steps of one packed split (this process's shards): ``len()`` and ``[i] -> Step``; ``meta``,
    ``split``, ``paths`` and ``source`` (the raw ``ArrayRecordDataSource``)."""

    def __init__(
        self, root, split: str | None = None, *, process_index: int | None = None, process_count: int | None = None
    ):
        self.root = Path(root)
        self.meta = read_metadata(self.root)
        self.split, info = split_info(self.meta, self.root, split)
        if process_index is None or process_count is None:
            import jax  # see data_source

            process_index, process_count = jax.process_index(), jax.process_count()
        files = process_files(
            info["files"], int(process_index), int(process_count), f"{self.root / METADATA_FILE} split {self.split!r}"
        )
        self.paths = tuple(str(p) for p in check_shards(self.root, self.split, files))
        self.counts = [f["records"] for f in files]
        self.source = data_source(self.paths)

    @property
    def scoring_format(self) -> str:
        return self.meta["scoring_format"]

    def __len__(self) -> int:
        return sum(self.counts)

    def locate(self, key: int) -> tuple[str, int]:
        """(shard file, position in it) of record ``key``: what an error message names."""
        for path, n in zip(self.paths, self.counts):
            if key < n:
                return path, key
            key -= n
        raise IndexError(key)

    def raw(self, key: int) -> bytes:
        try:
            return self.source[key]
        except RuntimeError as e:  # a chunk whose checksum fails
            raise DataError(*self.locate(key), "<record>", f"unreadable: {e}") from None

    def decode(self, key: int, payload: bytes) -> tuple[Step, dict]:
        where = self.locate(key)
        header, _ = split_record(payload, where)
        return step_from_header(header, RecordImage(self.paths, key), where)

    def __getitem__(self, key) -> Step:
        key = key.__index__()
        if not 0 <= key < len(self):
            raise IndexError(f"record {key} not in [0, {len(self)})")
        return self.decode(key, self.raw(key))[0]

    def read_all(self, skip_bad: bool = False):
        """Yield ``(key, Step, episode info)`` in order; a bad record raises ``DataError``, or with ``skip_bad``
        yields ``(key, None, the DataError)``."""
        for start in range(0, len(self), _CHUNK):
            keys = list(range(start, min(len(self), start + _CHUNK)))
            try:
                payloads = self.source.__getitems__(keys)
            except RuntimeError:  # find the unreadable record one by one
                payloads = [None] * len(keys)
            for key, payload in zip(keys, payloads):
                try:
                    step, episode = self.decode(key, self.raw(key) if payload is None else payload)
                except DataError as err:
                    if not skip_bad:
                        raise
                    yield key, None, err
                    continue
                yield key, step, episode


def open_split(
    root, split: str | None = None, *, process_index: int | None = None, process_count: int | None = None
) -> PackedSplit:
    """This process's share of a packed split as a random-access source of ``Step``s (see ``PackedSplit``)."""
    return PackedSplit(root, split, process_index=process_index, process_count=process_count)


def load_packed_with_report(root, split: str | None, skip_bad: bool = False) -> tuple[list[Episode], list]:
    """(episodes, skipped records) of a whole packed split, in packing order. A record that does not decode raises
    ``DataError`` (shard file, position), or with ``skip_bad`` is left out and listed."""
    packed = PackedSplit(root, split, process_index=0, process_count=1)
    skipped: list = []

    def good_steps():
        for _, step, episode in packed.read_all(skip_bad):
            if step is None:
                skipped.append(episode)
            else:
                yield step, episode

    return group_episodes(good_steps()), skipped


def load_packed(root, split: str | None, skip_bad: bool = False) -> list[Episode]:
    """The episodes of a packed split; see ``load_packed_with_report``."""
    return load_packed_with_report(root, split, skip_bad)[0]


def packed_scoring_format(root) -> str:
    """The metric rules of a packed directory's data (aitz | amex | androidcontrol)."""
    return read_metadata(root)["scoring_format"]
