"""``data.format = "tfds:NAME"``: episodes of a TFDS dataset built by ``builders.py`` (``config.data.root``: the
TFDS data directory), read with ``tfds.data_source``; images fetched when needed.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json

from PIL import Image

from ipl_jax.data.packed.encoding import group_episodes, step_from_header
from ipl_jax.data.records import DataError, Episode

_CHUNK = 256


def _tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ValueError(
            "data format tfds:NAME needs the tensorflow-datasets package: pip install 'ipl-jax[tfds]'"
        ) from None
    import ipl_jax.data.tfds.builders  # noqa: F401  (registers ipl_aitz; a prepared copy of any other reads as is)

    return tfds


@functools.lru_cache(maxsize=16)
def _builder(name: str, data_dir: str | None):
    tfds = _tfds()
    where = f"tfds:{name}" + (f" (data_dir {data_dir})" if data_dir else "")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"{where}: no TFDS dataset {name!r} is registered or prepared there (ipl-jax's builders: "
            f"ipl_aitz, and ipl_synthetic from ipl_jax.envs.synthetic.tfds_builder)"
        ) from None
    except (ValueError, KeyError) as e:  # e.g. an unknown config or version
        raise ValueError(f"{where}: {str(e).splitlines()[0]}") from None
    if not builder.is_prepared():
        raise ValueError(
            f"{where}: dataset {name!r} is registered but not prepared in {builder.data_dir}; "
            f"build it first (builder.download_and_prepare(file_format='array_record'))"
        )
    return builder


@functools.lru_cache(maxsize=32)
def split_source(name: str, data_dir: str | None, split: str):
    """The ``tfds.data_source`` of one split, screenshots left as PNG bytes."""
    tfds = _tfds()
    builder = _builder(name, data_dir)
    if split not in builder.info.splits:
        raise ValueError(f"tfds:{name}: no split {split!r} (have {', '.join(builder.info.splits)})")
    try:
        return builder.as_data_source(split=split, decoders={"screenshot": tfds.decode.SkipDecoding()})
    except NotImplementedError as e:  # prepared in another file format (tfrecord)
        raise ValueError(f"tfds:{name}: {str(e).splitlines()[0]}; prepare it with file_format='array_record'") from None


def tfds_scoring_format(name: str, data_dir) -> str:
    """The metric rules of a TFDS dataset built by ipl-jax (its ``metadata.json``)."""
    meta = _builder(name, str(data_dir) if data_dir else None).info.metadata or {}
    fmt = meta.get("scoring_format")
    if fmt is None:
        raise ValueError(f"tfds:{name}: its metadata names no scoring_format (not built by ipl-jax's builders)")
    return fmt


@dataclasses.dataclass(frozen=True)
class TfdsImage:
    """``Step.image`` of a TFDS step: example ``key`` of the split, its PNG fetched on call."""

    name: str
    data_dir: str | None
    split: str
    key: int

    def encoded(self) -> bytes:
        return split_source(self.name, self.data_dir, self.split)[self.key]["screenshot"]

    def __call__(self):

        return Image.open(io.BytesIO(self.encoded()))


def load_tfds_with_report(name: str, data_dir, split: str | None, skip_bad: bool = False) -> tuple[list[Episode], list]:
    """(episodes, skipped records) of one split of a TFDS dataset built by ipl-jax. An undecodable ``record``
    raises ``DataError`` (dataset, split, index), or with ``skip_bad`` is listed."""
    data_dir = str(data_dir) if data_dir else None
    split = "train" if split is None else split
    source = split_source(name, data_dir, split)
    where_file = f"tfds:{name}/{split}"
    skipped: list = []

    def good_steps():
        for start in range(0, len(source), _CHUNK):
            keys = list(range(start, min(len(source), start + _CHUNK)))
            for key, row in zip(keys, source.__getitems__(keys)):
                where = (where_file, key)
                try:
                    try:
                        header = json.loads(bytes(row["record"]).decode("utf-8"))
                    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
                        raise DataError(*where, "record", f"not a step header: {e}") from None
                    if not isinstance(header, dict):
                        raise DataError(*where, "record", "expected a JSON object")
                    pair = step_from_header(header, TfdsImage(name, data_dir, split, key), where)
                except DataError as err:
                    if not skip_bad:
                        raise
                    skipped.append(err)
                    continue
                yield pair

    return group_episodes(good_steps()), skipped
