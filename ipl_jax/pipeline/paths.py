"""Checks of the paths a command is given, before any expensive work; each raises a one-line ``UsageError``.
Outputs are probed (directories made, a file written, then all undone). An object-store URI (``gs://BUCKET/run``)
has its bucket, client and credentials checked (``storage.check_location``); an output's directory gets an object
of this process's own name written and removed, an input must exist on the store and is read from this host's
copy of it (``storage.local_dir`` / ``local_file``), so the commands read local files as before. ``local_only``
refuses a URI in one line where only a local path works (pathlib would read ``gs://B/x`` as the local ``gs:/B/x``).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import time
import uuid
from pathlib import Path

from safetensors import safe_open

from ipl_jax import storage


class UsageError(ValueError):
    """An invocation that cannot work as given; the message is one line naming the flag / field / file and the fix."""


def local_only(path: str | os.PathLike, flag: str, what: str) -> None:
    """``UsageError`` when ``path`` is an object-store URI where only a path on this host's disk works yet."""
    if storage.is_remote(path):
        raise UsageError(
            f"{flag} {os.fspath(path)}: takes {what} on this host's disk (object-store URIs are not supported here "
            f"yet); use a local path"
        )


def input_file(path: str | os.PathLike, flag: str, what: str = "a file") -> Path:
    """``path`` as an existing regular file; an object-store URI checked on its store and read from this host's
    copy of it (``storage.local_file``)."""
    if storage.is_remote(path):
        return storage.local_file(remote_input(path, flag, what, directory=False))
    return _existing(Path(path), flag, what, directory=False)


def input_dir(path: str | os.PathLike, flag: str, what: str = "a directory", fetch: bool = True) -> Path:
    """``path`` as an existing directory; an object-store URI checked on its store and, with ``fetch``, read from
    this host's copy of it (``storage.local_dir``; without: the URI's path, for readers that take URIs)."""
    if storage.is_remote(path):
        p = remote_input(path, flag, what, directory=True)
        return storage.local_dir(p) if fetch else p
    return _existing(Path(path), flag, what, directory=True)


def remote_input(uri: str | os.PathLike, flag: str, what: str, directory: bool):
    """An object-store URI that names an existing object (``directory``: a prefix with objects under it), its bucket
    reachable (``storage.check_location``); the one-line ``UsageError`` otherwise."""
    _check_store(uri, flag)
    p = storage.as_path(uri)
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except Exception as e:  # the store's clients raise their own types besides OSError
        raise UsageError(f"{flag} {uri}: cannot be read ({storage.reason(e)}); check access to the bucket") from None
    kind, other = ("directory", "object") if directory else ("object", "directory")
    if is_file if directory else is_dir:
        raise UsageError(f"{flag} {uri}: is an {other}, expected {what}")
    if not (is_dir if directory else is_file):
        raise UsageError(f"{flag} {uri}: no such {kind} (expected {what})")
    return p


def _check_store(uri: str | os.PathLike, flag: str) -> None:
    try:
        storage.check_location(uri)
    except storage.LocationError as e:
        raise UsageError(f"{flag} {e}") from None


def _existing(p: Path, flag: str, what: str, directory: bool) -> Path:
    """``p`` when it exists as a directory (``directory``) or a regular file; else the one-line error saying which."""
    kind, other = ("directory", "file") if directory else ("file", "directory")
    if p.is_file() if directory else p.is_dir():
        raise UsageError(f"{flag} {p}: is a {other}, expected {what}")
    if not (p.is_dir() if directory else p.is_file()):
        raise UsageError(f"{flag} {p}: no such {kind} (expected {what})")
    return p


def _kind(path: Path) -> str | None:
    """'dir', 'other' or None (missing), from one stat (safe against other processes probing the same path)."""
    try:
        return "dir" if stat.S_ISDIR(path.stat().st_mode) else "other"
    except (FileNotFoundError, NotADirectoryError):  # (the latter: a file stands where a parent should be)
        return None


def _probe_dir(directory: Path, flag: str, shown: Path) -> None:
    """Make ``directory`` (and its missing parents) and write a file in it, then undo both; errors name ``shown``."""
    directory = Path(os.path.abspath(directory))
    missing = []
    node = directory
    while _kind(node) is None and node != node.parent:
        missing.append(node)
        node = node.parent
    if _kind(node) == "other":
        raise UsageError(f"{flag} {shown}: cannot be created because {node} is a file; choose another path")
    try:
        for attempt in range(20):  # the processes of one job probe the same path: another may just have removed it
            try:
                directory.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryFile(dir=directory):
                    pass
                break
            except (FileNotFoundError, FileExistsError):  # made or removed by another process meanwhile
                if attempt == 19:
                    raise
                time.sleep(0.001 * (attempt + 1))  # let the other probe finish (a loaded machine lost 10 quick tries)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UsageError(f"{flag} {shown}: cannot be written ({reason}); choose a writable location") from None
    finally:
        for d in missing:  # deepest first; gone already or in use by another process: left to it
            try:
                d.rmdir()
            except OSError:
                pass


def output_dir(path: str | os.PathLike, flag: str, remote: bool = False) -> Path:
    """A directory that exists or can be created, and can be written into (nothing is left behind); with ``remote``
    an object-store URI is checked on its store (``remote_dir``), else refused."""
    if remote and storage.is_remote(path):
        return remote_dir(path, flag)
    local_only(path, flag, "a directory")
    p = Path(path)
    if _kind(p) == "other":
        raise UsageError(f"{flag} {p}: exists and is not a directory; choose a directory path")
    _probe_dir(p, flag, p)
    return p


def remote_dir(uri: str | os.PathLike, flag: str):
    """An object-store "directory" (a name prefix) that can be written: reachable (``storage.check_location``), not
    an object itself, and an object of this process's own name written there and removed (the processes of a job
    probe at once, each its own object)."""
    _check_store(uri, flag)
    p = storage.as_path(uri)
    probe = p / f".probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        if p.is_file():
            raise UsageError(f"{flag} {uri}: is an object, not a directory; choose a directory path")
        probe.write_text("")
        probe.unlink()
    except UsageError:
        raise
    except Exception as e:  # the store's clients raise their own types besides OSError
        raise UsageError(f"{flag} {uri}: cannot be written ({storage.reason(e)}); check access to the bucket") from None
    return p


def output_file(path: str | os.PathLike, flag: str) -> Path:
    """A file path that can be written (its directory exists or can be created); an object-store URI: not a
    directory, and its directory writable on its store (``remote_dir``)."""
    if storage.is_remote(path):
        _check_store(path, flag)  # (errors name the file's URI)
        p = storage.as_path(path)
        remote_dir(str(p.parent), flag)
        if p.is_dir():
            raise UsageError(f"{flag} {path}: is a directory; give a file path")
        return p
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {p}: is a directory; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {p}: is not writable; choose another file")
    _probe_dir(p.parent, flag, p)
    return p


def model_dir(path: str | os.PathLike, flag: str) -> Path:
    """A Hugging Face model directory: parseable ``config.json`` and safetensors whose headers read (cheap)."""
    p = input_dir(path, flag, "a Hugging Face model directory")
    config = p / "config.json"
    if not config.is_file():
        raise UsageError(f"{flag} {p}: no config.json; expected a Hugging Face model directory")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {config}: not valid JSON ({e}); re-download or re-export the model") from None
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise UsageError(f"{flag} {p}: no *.safetensors weights; expected a Hugging Face model directory")
    for w in weights:
        check_safetensors(w, flag)
    check_processor(p, flag)
    return p


def check_processor(p: Path, flag: str) -> None:
    """``UsageError`` when the directory's ``preprocessor_config.json`` cuts screenshots into patches of another size
    than its ``config.json``'s vision tower embeds (read before any weight)."""
    from ipl_jax.data.image_processing import PREPROCESSOR_CONFIG, ImageProcessorConfig
    from ipl_jax.model.config import Qwen2VLConfig

    if not (p / PREPROCESSOR_CONFIG).is_file():
        return
    try:
        ImageProcessorConfig.load_for_model(p, Qwen2VLConfig.from_dir(p))
    except ValueError as e:
        raise UsageError(f"{flag} {e}; the processor must be the model's own (re-download or re-export it)") from None


def check_safetensors(path: Path, flag: str) -> None:
    """Raise ``UsageError`` when ``path`` is not a readable safetensors file (truncated, corrupt header)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
    except Exception as e:  # safetensors raises its own error type (and OSError) for a broken file
        reason = " ".join(str(e).split()) or type(e).__name__
        raise UsageError(
            f"{flag} {path}: not a valid safetensors file ({reason}); re-download or re-export the model"
        ) from None
    if not names:
        raise UsageError(f"{flag} {path}: a safetensors file without tensors; re-download or re-export the model")
