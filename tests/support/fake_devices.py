"""Scripts run in a fresh Python process with N fake CPU devices: XLA reads the device count once, when jax starts,
so a test that needs a mesh of 8 cannot make one in the pytest process itself."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")


def start(script: str, *args: str, devices: int = 8) -> subprocess.Popen:
    """``python -c script *args`` with ``devices`` fake CPU devices, run from the repository root with it first on
    the import path; stdout and stderr piped (text)."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of a ``start``-ed process; asserts it exited with 0 (its stderr's tail as the message)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-4000:]
    return stdout, stderr


def run(script: str, *args: str, devices: int = 8, timeout: float = 300) -> str:
    """``start`` then ``finish``: the script's stdout."""
    return finish(start(script, *args, devices=devices), timeout)[0]
