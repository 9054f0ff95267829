"""The test-only fault hook: inert unless ``IPL_JAX_TEST_KILL_AT`` names the point and count reached, then the
process dies by SIGKILL (what the preemption tests in ``test_multiprocess.py`` rely on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ipl_jax import fault_hook


def test_inert_unless_the_point_and_count_match(monkeypatch):
    monkeypatch.delenv(fault_hook.ENV, raising=False)
    fault_hook.kill_at("sft_step", 1)  # unset: nothing happens
    monkeypatch.setenv(fault_hook.ENV, "sft_step=2")
    fault_hook.kill_at("sft_step", 1)
    fault_hook.kill_at("tdpo_step", 2)


def test_kills_the_process_at_the_named_point():
    code = "from ipl_jax import fault_hook\nfor k in range(1, 4):\n    fault_hook.kill_at('tdpo_step', k)\n    print(k)"
    env = {**os.environ, fault_hook.ENV: "tdpo_step=2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.split() == ["1"]
    assert "killing process" in proc.stderr
