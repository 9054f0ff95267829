"""Packing a dataset into ArrayRecord shards (``ipl-jax pack-data``) with its format's reader; deterministic
(byte-identical shards and metadata wherever the source lies).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from ipl_jax.data.aitz import load_aitz_with_report
from ipl_jax.data.amex import load_amex_with_report
from ipl_jax.data.android_control import SPLITS, load_android_control_with_report
from ipl_jax.data.packed.encoding import encode_step, image_bytes
from ipl_jax.data.packed.layout import FORMAT_NAME, METADATA_FILE, SCORING_FORMATS, VERSION, WRITER_OPTIONS, shard_name
from ipl_jax.data.records import Episode

DATASETS = tuple(SCORING_FORMATS)
_CACHE_DIR = "screenshot_cache"  # AndroidControl's default screenshot cache inside its root: not source data


# ---------------------------------------------------------------------------------------------- the source


def source_splits(dataset: str, root: Path) -> list[str]:
    """The splits a source directory holds (AITZ-layout folders, AMEX's ``all`` plus ``instruction_anno/<split>/``,
    AndroidControl's ``splits.json`` keys)."""
    if dataset in ("aitz", "synthetic"):
        return [
            d.name
            for d in sorted(root.iterdir())
            if d.is_dir() and not d.name.startswith(".") and any(d.glob("*/*/*.json"))
        ]
    if dataset == "amex":
        anno = root / "instruction_anno"
        if not anno.is_dir():
            return []
        return ["all"] + [d.name for d in sorted(anno.iterdir()) if d.is_dir() and any(d.glob("*.json"))]

    try:
        listed = json.loads((root / "splits.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{root / 'splits.json'}: unreadable ({e})") from None
    return [s for s in SPLITS if isinstance(listed, dict) and s in listed]


def read_split(dataset: str, root: Path, split: str, skip_bad: bool, cache_dir: Path) -> tuple[list[Episode], list]:
    """(episodes, skipped malformed records) of one split, read with the format's reader."""
    if dataset in ("aitz", "synthetic"):
        return load_aitz_with_report(root, split, skip_bad=skip_bad)
    if dataset == "amex":
        return load_amex_with_report(root, None if split == "all" else split, skip_bad=skip_bad)

    return load_android_control_with_report(root, split, skip_bad=skip_bad, cache_dir=cache_dir)


def tree_sha256(root: Path, exclude: Sequence[Path] = ()) -> str:
    """A digest of every file under ``root`` (sorted relative paths, sizes, contents), skipping ``exclude`` folders."""
    skip = [os.path.abspath(p) for p in exclude]
    digest = hashlib.sha256()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if os.path.abspath(os.path.join(dirpath, d)) not in skip)
        files += [Path(dirpath, f) for f in filenames]
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0{h.hexdigest()}\n".encode())
    return digest.hexdigest()


def _relative(meta: Mapping, roots: Sequence[Path]) -> dict:
    """``meta`` with its ``file`` made relative to the first of ``roots`` that holds it."""
    out = dict(meta)
    f = out.get("file")
    if isinstance(f, str):
        for r in roots:
            try:
                out["file"] = Path(f).resolve().relative_to(r.resolve()).as_posix()
                break
            except ValueError:
                continue
    return out


def portable(episodes: Iterable[Episode], roots: Sequence[Path]) -> list[Episode]:
    """Episodes whose steps' and own ``meta["file"]`` are relative to ``roots``."""
    out = []
    for ep in episodes:
        steps = tuple(dataclasses.replace(s, meta=_relative(s.meta, roots)) for s in ep.steps)
        out.append(dataclasses.replace(ep, steps=steps, meta=_relative(ep.meta, roots)))
    return out


# ---------------------------------------------------------------------------------------------- writing


def shard_of_episodes(step_counts: Sequence[int], shards: int) -> list[int]:
    """The shard of each episode (⌊first_step(e)·N / total_steps⌋): whole consecutive episodes, even step counts."""
    total = max(1, sum(step_counts))
    out, start = [], 0
    for n in step_counts:
        out.append(min(shards - 1, start * shards // total))
        start += n
    return out


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_split(
    out: Path,
    split: str,
    episodes: Sequence[Episode],
    shards: int,
    png_level: int = 6,
    on_step: Callable[[], None] | None = None,
) -> dict:
    """Write one split's shards under ``out``; returns its metadata entry (without ``skipped``)."""
    from array_record.python.array_record_module import ArrayRecordWriter  # as layout.check_shards: on use

    owner = shard_of_episodes([len(e.steps) for e in episodes], shards)
    files = []
    for k in range(shards):
        name = shard_name(split, k, shards)
        writer = ArrayRecordWriter(str(out / name), WRITER_OPTIONS)
        count = 0
        try:
            for ep, o in zip(episodes, owner):
                if o != k:
                    continue
                for step in ep.steps:
                    writer.write(encode_step(step, ep, image_bytes(step, png_level)))
                    count += 1
                    if on_step is not None:
                        on_step()
        finally:
            writer.close()
        files.append({"name": name, "records": count, "sha256": _file_sha256(out / name)})
    return {"episodes": len(episodes), "steps": sum(len(e.steps) for e in episodes), "files": files}


def check_out(out: Path, source: Path | None = None) -> None:
    """``out`` must be new, empty, or an earlier pack (which is replaced), and not the source directory."""
    if source is not None and Path(os.path.abspath(out)) == Path(os.path.abspath(source)):
        raise ValueError(f"--out {out}: is the source directory; choose another")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / METADATA_FILE).is_file():
        raise ValueError(f"--out {out}: directory is not empty and holds no earlier pack; choose an empty one")


def _prepare_out(out: Path) -> None:
    """An empty (or new) directory, or one holding an earlier pack, which is replaced."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = list(out.iterdir())
    (out / METADATA_FILE).unlink(missing_ok=True)  # first: a half-rewritten pack must not look complete
    for e in entries:
        if ".array_record-" in e.name and e.is_file():
            e.unlink()


def write_packed(
    out,
    splits: Mapping[str, Sequence[Episode]],
    *,
    dataset: str,
    source_sha256: str,
    shards: int = 1,
    skipped: Mapping[str, int] | None = None,
    png_level: int = 6,
    on_step: Callable[[], None] | None = None,
) -> dict:
    """Write ``splits`` (name -> episodes) as a packed directory; returns the metadata written.

    ``dataset``: aitz | amex | androidcontrol | synthetic; ``png_level``: PNG compression for screenshots that are
    not already PNG/JPEG bytes."""
    if dataset not in SCORING_FORMATS:
        raise ValueError(f"unknown dataset format {dataset!r}; known: {', '.join(SCORING_FORMATS)}")
    if shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    out = Path(out)
    _prepare_out(out)
    meta = {
        "format": FORMAT_NAME,
        "version": VERSION,
        "dataset": dataset,
        "scoring_format": SCORING_FORMATS[dataset],
        "source_sha256": source_sha256,
        "shards": shards,
        "splits": {},
    }
    for split, episodes in splits.items():
        entry = write_split(out, split, episodes, shards, png_level, on_step)
        entry["skipped"] = int((skipped or {}).get(split, 0))
        meta["splits"][split] = entry
    tmp = out / (METADATA_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / METADATA_FILE)
    return meta


def pack_dataset(
    dataset: str,
    root,
    out,
    *,
    shards: int = 1,
    splits: Sequence[str] | None = None,
    skip_bad: bool = False,
    on_split: Callable[[str, int, list], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> dict:
    """Read every split (or ``splits``) of ``root`` in format ``dataset`` and pack it to ``out``.

    Malformed records raise ``DataError`` unless ``skip_bad`` (then counted per split). ``on_split(split,
    episodes, skipped)`` is called after each split is read."""
    if dataset not in SCORING_FORMATS:
        raise ValueError(f"--format {dataset!r}: must be one of {', '.join(SCORING_FORMATS)}")
    root, out = Path(root), Path(out)
    if not root.is_dir():
        raise FileNotFoundError(f"--data {root}: no such directory")
    if shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    check_out(out, root)
    available = source_splits(dataset, root)
    wanted = list(available if splits is None else splits)
    missing = [s for s in wanted if s not in available]
    if missing or not wanted:
        raise ValueError(
            f"--data {root}: no split {', '.join(missing) or '(none found)'} in this {dataset} data "
            f"(found: {', '.join(available) or 'none'})"
        )
    source_sha = tree_sha256(root, exclude=[out, root / _CACHE_DIR])
    read, skipped = {}, {}
    with tempfile.TemporaryDirectory(prefix="ipl_pack_cache_") as cache:
        for split in wanted:
            episodes, bad = read_split(dataset, root, split, skip_bad, Path(cache))
            if on_split is not None:
                on_split(split, len(episodes), bad)
            read[split] = portable(episodes, [root, Path(cache)])
            skipped[split] = len(bad)
        # the screenshots cached by the AndroidControl reader are read while the cache still exists
        return write_packed(
            out, read, dataset=dataset, source_sha256=source_sha, shards=shards, skipped=skipped, on_step=on_step
        )
