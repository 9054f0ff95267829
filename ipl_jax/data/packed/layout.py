"""The on-disk layout of a packed dataset: per split N shards ``<split>.array_record-<k>-of-<N>`` of whole
episodes, one ``ipl_jax_arrayrecord.json`` written last, and process p of P reading shards [p·N/P, (p+1)·N/P).
"""

from __future__ import annotations

import json
from pathlib import Path

from ipl_jax import storage

METADATA_FILE = "ipl_jax_arrayrecord.json"
FORMAT_NAME = "ipl-jax-arrayrecord"
VERSION = 1
SCORING_FORMATS = {"aitz": "aitz", "synthetic": "aitz", "amex": "amex", "androidcontrol": "androidcontrol"}
WRITER_OPTIONS = "group_size:1"  # one record per chunk: a random read decompresses only its own record


def shard_name(split: str, k: int, n: int) -> str:
    return f"{split}.array_record-{k:05d}-of-{n:05d}"


def is_packed(root) -> bool:
    """Whether ``root`` is a directory written by ``pack-data`` (it holds the metadata file)."""
    try:
        return (storage.as_path(root) / METADATA_FILE).is_file()
    except (TypeError, OSError):
        return False


def _bad(path: Path, problem: str) -> ValueError:
    return ValueError(f"{path}: {problem}")


def read_metadata(root) -> dict:
    """The validated metadata of a packed directory. Raises ``FileNotFoundError`` when there is none and
    ``ValueError`` when it is malformed or of another version."""
    path = storage.as_path(root) / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no {METADATA_FILE}; not a packed dataset (write one with ipl-jax pack-data)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise _bad(path, f"not an ipl-jax ArrayRecord metadata file (format must be {FORMAT_NAME!r})")
    if meta.get("version") != VERSION:
        raise _bad(
            path,
            f"packed with version {meta.get('version')!r}; this ipl-jax reads version {VERSION} "
            f"(repack the source with ipl-jax pack-data)",
        )
    if meta.get("scoring_format") not in set(SCORING_FORMATS.values()):
        raise _bad(
            path,
            f"scoring_format {meta.get('scoring_format')!r} is not one of "
            f"{', '.join(sorted(set(SCORING_FORMATS.values())))}",
        )
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise _bad(path, "field 'splits' must be a non-empty object")
    for name, info in splits.items():
        files = info.get("files") if isinstance(info, dict) else None
        if (
            not isinstance(files, list)
            or not files
            or not all(
                isinstance(f, dict)
                and isinstance(f.get("name"), str)
                and "/" not in f["name"]
                and isinstance(f.get("records"), int)
                and f["records"] >= 0
                for f in files
            )
        ):
            raise _bad(path, f"split {name!r}: 'files' must list {{name, records}} of shard files in this directory")
    return meta


def split_info(meta: dict, root, split: str | None) -> tuple[str, dict]:
    """(split name, its metadata). ``split`` None (or "all") means AMEX's single split ``all``."""
    name = "all" if split is None else split
    if name not in meta["splits"]:
        raise ValueError(
            f"{Path(root) / METADATA_FILE}: no split {name!r} in this packed {meta.get('dataset')} "
            f"data (have {', '.join(meta['splits'])})"
        )
    return name, meta["splits"][name]


def process_files(files: list, process_index: int, process_count: int, where: str) -> list:
    """Process ``process_index``'s contiguous share of ``files``; they must divide evenly among the processes."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process index {process_index} is not in [0, {process_count})")
    n = len(files)
    if n % process_count:
        raise ValueError(
            f"{where}: {n} shard file{'s' * (n != 1)} cannot be divided among {process_count} "
            f"processes; repack with ipl-jax pack-data --shards a multiple of {process_count}"
        )
    per = n // process_count
    return files[process_index * per : (process_index + 1) * per]


def check_shards(root, split: str, files: list[dict]) -> list[Path]:
    """The shard paths, each checked to open and hold the records the metadata lists (raises before any read)."""
    # ArrayRecord loads only for packed data, so that the commands reading other formats start without it
    from array_record.python.array_record_module import ArrayRecordReader

    paths = []
    for f in files:
        path = Path(root) / f["name"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: shard of split {split!r} listed in {METADATA_FILE} is missing")
        reader = ArrayRecordReader(str(path))
        if not reader.ok():  # the reader keeps its error to itself (closing it would raise it, bare)
            raise _bad(path, "not a readable ArrayRecord file (truncated, corrupted, or another kind of file)")
        count = reader.num_records()
        reader.close()
        if count != f["records"]:
            raise _bad(
                path,
                f"holds {count} records but {METADATA_FILE} lists {f['records']}; the directory "
                f"mixes two packs (repack it)",
            )
        paths.append(path)
    return paths


def check_packed_format(root, fmt: str) -> None:
    """A packed directory read under a published format's name must hold data scored by that format's rules."""
    meta = read_metadata(root)
    if SCORING_FORMATS.get(fmt) != meta["scoring_format"]:
        raise ValueError(
            f"{Path(root) / METADATA_FILE}: this directory holds packed {meta.get('dataset')} data, "
            f"not {fmt}; read it as format {meta['scoring_format']} or arrayrecord"
        )
