"""Running a command the way the tests do: in a subprocess, output captured, its exit checked."""

from __future__ import annotations

import subprocess


def run_ok(args, *, cwd, env=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``args`` run to completion; a non-zero exit fails the test with the ends of stdout and stderr."""
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
