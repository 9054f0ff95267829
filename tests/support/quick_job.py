"""The quick job as the end-to-end tests run it: ``ipl-jax`` commands in fresh interpreters, and one local run of
``synthetic:quick`` per test session (fixture ``quick_run``) that the job tests (``test_pipeline_run.py``) and the
bucket tests (``test_bucket_job.py``) read, so the job runs once.

The run (about 2 min on two busy CPU cores when the notebook test has filled the shared compilation cache) is
made in two invocations (``ipl-jax sft``, then ``ipl-jax run``), so the second invocation resuming after a
finished stage is itself under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


def run_cli(
    args: list[str], cache_dir: Path, env: dict | None = None, cwd: Path | None = None, ok: bool = True
) -> subprocess.CompletedProcess:
    """``ipl-jax ...`` in a fresh interpreter of this environment (``env``: the variables to start from, default
    this process's; ``ok``: assert it succeeds). JAX's persistent compilation cache is shared by every job of the
    test session (the job tests and the notebook test), so a program compiles once."""
    env = dict(
        os.environ if env is None else env,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        IPL_JAX_QUIET="1",
        JAX_COMPILATION_CACHE_DIR=str(cache_dir),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ipl_jax.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900
    )
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """The local quick job: {config, workdir, lines (its output), first_seconds (the ``sft`` invocation), cache}."""
    from ipl_jax.configs.loader import load_settings

    config = load_settings("synthetic:quick")
    workdir = tmp_path_factory.mktemp("quick_job")
    cache = tmp_path_factory.getbasetemp() / "jax_compilation_cache"
    t0 = time.perf_counter()
    first = run_cli(["sft", "--config", "synthetic:quick", "--workdir", str(workdir)], cache)
    first_seconds = time.perf_counter() - t0
    # `ipl-jax sft` stops after the SFT stage with the candidates written as Hugging Face directories
    assert (workdir / "stages" / "sft.done").is_file() and not (workdir / "stages" / "start.done").exists()
    candidates = sorted((workdir / "sft" / "candidates").iterdir())
    assert [c.name for c in candidates] == [f"step_{s:06d}" for s in (4, 8)]
    assert all((c / "config.json").is_file() and (c / "tokenizer.json").is_file() for c in candidates)
    second = run_cli(["run", "--config", "synthetic:quick", "--workdir", str(workdir)], cache)
    return {
        "config": config,
        "workdir": Path(workdir),
        "lines": (first.stdout + second.stdout).splitlines(),
        "first_seconds": first_seconds,
        "cache": cache,
    }
