"""A pod without a shared disk: two ``ipl-jax run`` processes on this host (two CPU devices each) whose only
shared place is one ``gs://`` workdir in the GCS emulator's bucket (``support.gcs_emulator``) give the results
and weights of one process (four devices) on a local disk. Each process keeps its scratch (``IPL_JAX_SCRATCH``),
its temp dir (``TMPDIR``) and its compilation cache on a disk of its own, as the hosts of a TPU slice do. The
jobs are the shrunken ``synthetic:quick`` of ``test_multiprocess.py`` (``support.multi_job``)."""

from __future__ import annotations

import json

import pytest
from support.gcs_emulator import client_env
from support.multi_job import assert_same_job, finish, free_port, launch_processes, weights_diff

from ipl_jax import storage

pytestmark = pytest.mark.e2e


def _host(root, i: int) -> dict:
    """The variables of host ``i``: its scratch, temp dir and compilation cache under ``root/host<i>``."""
    disk = root / f"host{i}"
    (disk / "tmp").mkdir(parents=True)
    return {
        storage.SCRATCH_ENV: str(disk / "scratch"),
        "TMPDIR": str(disk / "tmp"),
        "JAX_COMPILATION_CACHE_DIR": str(disk / "xla_cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def test_two_hosts_sharing_only_a_bucket_equal_one_process(gcs_bucket, tmp_path, monkeypatch):
    uri = f"{gcs_bucket.uri}/pod"
    hosts = dict(env_extra=client_env(gcs_bucket.url), host_env=lambda i: _host(tmp_path, i))
    two = launch_processes(uri, 2, 2, free_port(), tmp_path / "two", **hosts)
    finish(two + launch_processes(tmp_path / "one", 1, 4, 0, tmp_path / "one"))
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "reader"))  # the bucket read from a third disk
    pod = storage.local_dir(uri)
    assert json.loads((pod / "results.json").read_text())["rounds"][1]["pairs"] > 0
    assert_same_job(tmp_path / "one", pod)
    assert weights_diff(pod / "export", tmp_path / "one" / "export") <= 1e-5
    # only process 0 wrote the job's logs: one line per stage event, as the one-process job
    events = lambda wd: [json.loads(x)["stage"] + json.loads(x)["event"] for x in (wd / "stage_log.jsonl").open()]
    assert events(pod) == events(tmp_path / "one")
    # nothing of the workdir landed on a host's disk outside its scratch, temp dir and cache
    assert sorted(p.name for p in (tmp_path / "host1").iterdir()) == ["scratch", "tmp", "xla_cache"]
