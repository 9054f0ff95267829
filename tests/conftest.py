"""Fixtures shared by the test modules. Plain helper functions (model builders, input makers) are in the
``support`` package next to this file, where subprocess scripts can import them too; no test module imports
another test module."""

import gc
import os
import sys
from pathlib import Path

import jax
import pytest
from support.commands import run_ok
from support.gcs_emulator import gcs_bucket, gcs_emulator  # noqa: F401 (fixtures: a GCS emulator and a bucket)
from support.quick_job import quick_run  # noqa: F401 (fixture: the local quick job, run once per session)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """JAX's in-memory caches emptied after each test module: one process compiles the whole suite's programs, and
    the executables of finished modules would otherwise stay in its memory to the end."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def highest_precision():
    """Float32 matmuls at full precision for the duration of a test (parity checks at 1e-4 and tighter)."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="session")
def sampler_model():
    """(cfg, params) of the sampler tests' tiny random Qwen2-VL (``support.sampler_models``)."""
    from support.sampler_models import tiny_config, tiny_params

    cfg = tiny_config()
    return cfg, tiny_params(cfg)


@pytest.fixture(scope="session")
def device_check_cpu(tmp_path_factory):
    """The folder ``tools/device_check.sh --cpu`` wrote (every part with tiny sizes), run once per session."""
    out = tmp_path_factory.mktemp("device_check")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH", "JAX_PLATFORMS")}
    env["PYTHON"] = sys.executable  # the interpreter running the tests, also where the checkout has no .venv
    repo = Path(__file__).resolve().parent.parent
    run_ok(
        ["bash", str(repo / "tools" / "device_check.sh"), "--cpu", "--out", str(out)],
        cwd=repo,
        env=env,
        timeout=1800,
    )
    return out
