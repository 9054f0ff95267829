"""Where the job's files live: a local path, or an object-store URI (``gs://BUCKET/...`` and the other schemes
``etils.epath`` handles). One place turns a command's or config's string into a path object, says whether it is
remote, writes a file whole or appends to it on either kind of store, keeps this host's scratch for caches, and
checks a location before any work (one line naming the URI and the fix).

Local strings become ``pathlib.Path`` exactly as before; URIs become ``etils.epath.Path`` (imported on first use).
epath reaches ``gs://`` through ``tf.io.gfile`` when TensorFlow is importable and ``EPATH_USE_TF`` is not false,
else through fsspec's ``gcsfs`` (the ``gcs`` extra); gcsfs and tensorstore (Orbax's arrays) honour an emulator's
``STORAGE_EMULATOR_HOST`` / ``TENSORSTORE_GCS_HTTP_URL``.

Object storage has no directories and no rename: a "directory" is a name prefix (nothing to create), an object
is replaced whole by one upload (a reader sees the old or the new one, never a part), and an append rewrites the
object. What each file of a job's workdir keeps on a store (only the main process writes any of them):

- ``stages/STAGE.done``: write-then-mark. One object, written after every output of the stage has been uploaded
  (and Orbax has committed its checkpoint); a reader that sees it sees the outputs (GCS reads and listings are
  strongly consistent after a write). A job killed before it reruns the stage, which rewrites its outputs whole.
- ``config.json``, ``results.json``, ``job_report.json``, ``rounds/R/round.json``, ``evolution/qas.jsonl``,
  ``eval/round_R/*.jsonl``, ``rounds/R/trees.*``, ``step_accuracy.png``, ``trees.html``: one upload each, so a
  reader sees the old or the new object whole (locally: a temporary file renamed, or written before the marker).
- ``stage_log.jsonl``, ``metrics.jsonl``: each record rewrites the object with this process's copy plus the
  record (``append_text``); a killed job keeps every record but the one being written.
- policy directories (``model/init``, ``model/tokenizer``, ``sft/candidates/step_N``, ``start``,
  ``rounds/R/policy``, ``export``) and the synthetic ``data/``: written in this host's scratch, then the old
  objects removed and each file uploaded (``staged_dir``, ``copy_tree``). There is no atomic swap of a whole
  directory: one is read only once the marker of the stage that wrote it exists, and a rerun rewrites it whole.
  Readers that need a local directory (transformers, safetensors, tokenizers) read this host's copy
  (``local_dir``), an object fetched again when its size or modification time changed.
- ``sft/checkpoints/STEP`` (Orbax, through tensorstore): Orbax's own protocol on a store; a step counts once its
  ``commit_success.txt`` is written, so a step cut off by a kill is not restored.
- ``tensorboard/RUN/events...``: one object per run, uploaded whole after each batch of events.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import tempfile
from typing import Any

# scheme -> the fsspec package that reaches it (what epath's fsspec backend needs)
SCHEMES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}
SCRATCH_ENV = "IPL_JAX_SCRATCH"
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class LocationError(ValueError):
    """A location that cannot work as given; the message is one line naming the URI and what to do."""


def scheme(path: Any) -> str | None:
    """The URI scheme of ``path`` ('gs', 's3', ...; 'file' for file://), or None for a plain local path."""
    m = _URI.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    return m.group(1).lower() if m else None


def is_remote(path: Any) -> bool:
    """Whether ``path`` names an object store (any ``scheme://`` but ``file://``), not this host's disk."""
    return scheme(path) not in (None, "file")


def as_path(path: str | os.PathLike) -> pathlib.Path | Any:
    """``path`` as a path object: ``pathlib.Path`` for a local one (unchanged: not resolved), ``etils.epath.Path``
    for a URI (``file://`` made local). A path object passes through."""
    if isinstance(path, pathlib.PurePath) and not isinstance(path, pathlib.Path):  # an epath.Path already
        return path
    s = os.fspath(path)
    if scheme(s) == "file":
        return pathlib.Path(s[len("file://") :])
    if not is_remote(s):
        return path if isinstance(path, pathlib.Path) else pathlib.Path(s)
    from etils import epath

    return epath.Path(s)


def absolute(path: str | os.PathLike) -> str:
    """``path`` as an absolute string: a local path through ``os.path.abspath``, a URI as it is."""
    s = os.fspath(path)
    return s if is_remote(s) else os.path.abspath(s)


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old or the new content whole: locally a temporary file
    renamed into place (its directory made); on an object store one upload, which replaces the object whole."""
    p = as_path(path)
    if is_remote(p):
        p.write_text(text, encoding="utf-8")
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def append_text(path, text: str, known: str | None = None) -> str:
    """Append ``text`` to ``path``; returns the content now there. Locally an append; on an object store (which has
    no append) the object rewritten with ``known`` (the content this process last wrote, else read) plus ``text``,
    so only one process may append to an object."""
    p = as_path(path)
    if not is_remote(p):
        with open(p, "a", encoding="utf-8") as f:
            f.write(text)
        return ""  # (not kept: a local file is appended in place)
    if known is None:
        known = p.read_text(encoding="utf-8") if p.exists() else ""
    content = known + text
    p.write_text(content, encoding="utf-8")
    return content


def make_dir(path) -> Any:
    """``path`` as a directory: made (with parents) on this host's disk; on an object store nothing is made (a
    directory is a name prefix, and fsspec's mkdir may create a bucket)."""
    p = as_path(path)
    if not is_remote(p):
        p.mkdir(parents=True, exist_ok=True)
    return p


def scratch_dir(location: str | os.PathLike, *parts: str) -> pathlib.Path:
    """A directory on this host's own disk for caches of what lives at ``location`` (decoded screenshots, compile
    caches): under ``$IPL_JAX_SCRATCH`` or the system temp dir, one per location (its last name and a hash), made.
    Hosts of a pod share no disk, so each keeps its own."""
    base = pathlib.Path(os.environ.get(SCRATCH_ENV) or os.path.join(tempfile.gettempdir(), "ipl-jax-scratch"))
    where = absolute(location)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", where.rstrip("/").rsplit("/", 1)[-1]) or "root"
    d = base / f"{name}-{hashlib.sha1(where.encode()).hexdigest()[:12]}"
    d = d.joinpath(*parts)
    d.mkdir(parents=True, exist_ok=True)
    return d


def upload_tree(local: str | os.PathLike, dest) -> int:
    """Copy every file under the local directory ``local`` to the same names under ``dest`` (a URI or a local
    directory), each written whole; returns the number of files."""
    local, dest = pathlib.Path(local), as_path(dest)
    n = 0
    for src in sorted(p for p in local.rglob("*") if p.is_file()):
        target = dest.joinpath(*src.relative_to(local).parts)
        make_dir(target.parent)
        _copy_bytes(src, target)
        n += 1
    return n


def local_copy(location, *parts: str) -> pathlib.Path:
    """``location`` as a directory on this host's disk: itself when local; for a URI, every object under it
    downloaded into this host's scratch (``scratch_dir(location, *parts)``), an object fetched again only when its
    size or modification time changed since the last copy (kept beside the copy, in ``<copy>.copied.json``)."""
    if not is_remote(location):
        return as_path(location)
    from ipl_jax.progress import progress

    root, out = as_path(location), scratch_dir(location, *parts)
    manifest = out.with_name(out.name + ".copied.json")
    seen = json.loads(manifest.read_text()) if manifest.is_file() else {}
    now: dict[str, list] = {}
    fetch = []
    for src in _objects(root):
        rel = "/".join(src.relative_to(root).parts)
        st = src.stat()
        now[rel] = [int(st.length), float(st.mtime)]
        if seen.get(rel) != now[rel] or not (out / rel).is_file():
            fetch.append((src, out / rel))
    # a large first copy shows its progress; the processes of one host may copy at once: each its own .part file
    for src, target in progress(fetch, desc=f"copy {location}", unit="file") if len(fetch) > 100 else fetch:
        target.parent.mkdir(parents=True, exist_ok=True)
        _download(src, target)
    for rel in set(seen) - set(now):  # gone from the store: gone here
        (out / rel).unlink(missing_ok=True)
    tmp = manifest.with_name(f"{manifest.name}.part{os.getpid()}")
    tmp.write_text(json.dumps(now))
    os.replace(tmp, manifest)
    return out


def local_dir(location) -> pathlib.Path:
    """``location`` where a library needs a local directory (transformers, safetensors, tokenizers): itself when
    local, else this host's cached copy of it (``local_copy``)."""
    return local_copy(location, "copy")


def local_file(location) -> pathlib.Path:
    """``location`` where a reader needs a local file: itself when local, else the object downloaded whole into this
    host's scratch (again at each call: such inputs are small, a predictions file)."""
    if not is_remote(location):
        return as_path(location)
    src = as_path(location)
    target = scratch_dir(location, "file") / (src.name or "object")
    _download(src, target)
    return target


def _download(src, target: pathlib.Path) -> None:
    """The object ``src`` to the local file ``target`` through a file of this process's own (the processes of one
    host may fetch the same object at once), renamed into place."""
    tmp = target.with_name(f"{target.name}.part{os.getpid()}")
    _copy_bytes(src, tmp)
    os.replace(tmp, target)


def _copy_bytes(src, dest) -> None:
    """The bytes of the file ``src`` written to ``dest`` (path objects of either kind of store), 4 MiB at a time."""
    with as_path(src).open("rb") as f, as_path(dest).open("wb") as g:
        shutil.copyfileobj(f, g, 1 << 22)


@contextlib.contextmanager
def staged_dir(dest):
    """A local directory to write the directory ``dest`` in: for a URI a fresh one in this host's scratch, uploaded
    to ``dest`` (what was there removed first) when the block ends without error; a local ``dest`` is yielded as
    it is (the caller keeps its own local discipline)."""
    if not is_remote(dest):
        yield as_path(dest)
        return
    work = scratch_dir(dest, "write")
    shutil.rmtree(work)  # what an interrupted attempt left
    out = work / (as_path(dest).name or "dir")
    out.mkdir(parents=True)
    try:
        yield out
        remove_tree(dest)
        upload_tree(out, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remove_tree(path) -> None:
    """Remove the directory ``path`` with everything under it, when it is there (on a store: every object under
    the prefix, one by one)."""
    p = as_path(path)
    if not is_remote(p):
        if p.exists():
            shutil.rmtree(p)
        return
    if p.is_dir():
        for obj in _objects(p):
            obj.unlink()


def copy_tree(src, dest) -> None:
    """Copy the directory ``src`` to ``dest`` (either may be a URI), replacing what ``dest`` held: between local
    directories ``shutil.copytree``; else ``src``'s local copy (``local_dir``) uploaded file by file."""
    if not is_remote(src) and not is_remote(dest):
        remove_tree(dest)
        shutil.copytree(src, dest)
        return
    remove_tree(dest)
    upload_tree(local_dir(src), dest)


def copy_file(src, dest):
    """Copy the file ``src`` to ``dest`` (either may be a URI); returns ``dest`` as a path."""
    s, d = as_path(src), as_path(dest)
    if not is_remote(s) and not is_remote(d):
        return shutil.copyfile(s, d)
    _copy_bytes(s, d)
    return d


def _objects(root) -> list:
    """Every object under ``root`` (epath's ``rglob`` refuses ``**`` on a store), in name order."""
    out, todo = [], [root]
    while todo:
        for p in todo.pop().iterdir():
            (todo if p.is_dir() else out).append(p)
    return sorted(out, key=str)


# ------------------------------------------------------------------------------------------------------- checks


def check_location(uri: str | os.PathLike) -> None:
    """Raise ``LocationError`` (one line naming ``uri`` and the fix) when ``uri`` is a URI that cannot be reached:
    a scheme nothing here handles, a missing client package, no credentials, a bucket that does not exist or
    cannot be read. A local path passes (the callers probe it)."""
    s = os.fspath(uri)
    kind = scheme(s)
    if not is_remote(s):
        return
    if kind not in SCHEMES:
        known = ", ".join(f"{k}://" for k in SCHEMES)
        raise LocationError(f"{s}: no filesystem handles {kind}:// URIs; use a local path or one of {known}")
    if not _client_installed(kind):
        hint = "pip install 'ipl-jax[gcs]'" if kind == "gs" else f"pip install {SCHEMES[kind]}"
        raise LocationError(f"{s}: {kind}:// needs the {SCHEMES[kind]} package; {hint}")
    bucket = _bucket(s)
    if not bucket:
        raise LocationError(f"{s}: names no bucket; write {kind}://BUCKET/PATH")
    if kind == "gs":
        _check_gcs_credentials(s)
    try:
        found = as_path(f"{kind}://{bucket}").exists()
    except Exception as e:  # the clients raise their own types (HttpError, tf errors) besides OSError
        raise LocationError(
            f"{s}: bucket {bucket} cannot be reached ({reason(e)}); check the name and access"
        ) from None
    if not found:
        how = f" (gcloud storage buckets create gs://{bucket})" if kind == "gs" else ""
        raise LocationError(f"{s}: bucket {bucket} does not exist; create it{how} or fix the name")


def _client_installed(kind: str) -> bool:
    if kind == "gs" and _epath_uses_tf():
        return True
    return importlib.util.find_spec(SCHEMES[kind]) is not None


def _epath_uses_tf() -> bool:
    """Whether epath reaches gs:// through tf.io.gfile (TensorFlow importable, ``EPATH_USE_TF`` not false)."""
    if os.environ.get("EPATH_USE_TF", "").lower() in ("false", "no", "f", "0"):
        return False
    return importlib.util.find_spec("tensorflow") is not None


def emulated() -> bool:
    """Whether ``STORAGE_EMULATOR_HOST`` points the Google clients at an emulator (which needs no credentials)."""
    return os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default")


def _check_gcs_credentials(uri: str) -> None:
    """Google's application default credentials must be found (an emulator needs none)."""
    if emulated() or importlib.util.find_spec("google.auth") is None:
        return
    import google.auth
    import google.auth.exceptions

    try:
        google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError as e:
        raise LocationError(
            f"{uri}: no Google Cloud credentials found ({reason(e)}); run `gcloud auth application-default "
            f"login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
        ) from None


def _bucket(uri: str) -> str:
    return uri.split("://", 1)[1].split("/", 1)[0]


def reason(e: BaseException) -> str:
    """An error as one line of at most 200 characters (for the one-line messages)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
