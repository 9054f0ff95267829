"""Multi-process jobs of a shrunken ``synthetic:quick`` for the tests: ``ipl-jax run`` processes on this host
(CPU devices each, gloo collectives between them) meeting through ``--coordinator localhost:PORT``, and the checks
that two finished jobs on different process / device layouts agree (``assert_same_job``). Used by
``test_multiprocess.py`` (local workdirs) and ``test_bucket_pods.py`` (one ``gs://`` workdir)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipl_jax.fault_hook import ENV as KILL_AT

REPO = Path(__file__).resolve().parent.parent.parent

# every stage of the job, with as little work per stage as keeps each one meaningful
SMALL = [
    "--config.data.train_episodes=8",
    "--config.data.annotated_episodes=3",  # the default's scarce path: warm-up SFT on 3, the rounds on 5 action logs
    "--config.data.action_episodes=5",
    "--config.data.test_splits=test",
    "--config.evolution.max_items=8",
    "--config.sft.steps=2",
    "--config.sft.checkpoint_every=1",
    "--config.start_selection.steps=4",
    "--config.eval.max_steps=4",
    "--config.eval.blank_splits=",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(
    workdir: Path | str, devices: int, extra: list[str], log: Path, env_extra: dict | None = None
) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
        IPL_JAX_QUIET="1",
        IPL_JAX_INIT_TIMEOUT="120",
        **(env_extra or {}),
    )
    args = [sys.executable, "-m", "ipl_jax.cli", "run", "--config", "synthetic:quick", "--workdir", str(workdir)]
    return subprocess.Popen(args + SMALL + extra, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def launch_processes(
    workdir: Path | str,
    n: int,
    devices: int,
    port: int,
    logs: Path,
    extra=(),
    env_extra=None,
    kill: dict | None = None,
    host_env=None,
) -> list[tuple[subprocess.Popen, Path]]:
    """The ``n`` processes of one job (``devices`` CPU devices each; one process: no coordinator), logs
    ``<logs>.<i>.log``; ``kill`` {process: point} arms the fault hook in those processes; ``host_env(i)``: the
    variables of process ``i`` alone (a host's own disk)."""
    procs = []
    for i in range(n):
        flags = ["--coordinator", f"localhost:{port}", "--num-processes", str(n), "--process-id", str(i)]
        env = dict(env_extra or {}, **(host_env(i) if host_env else {}))
        if kill and i in kill:
            env[KILL_AT] = kill[i]
        log = Path(f"{logs}.{i}.log")
        procs.append((launch(workdir, devices, (flags if n > 1 else []) + list(extra), log, env), log))
    return procs


def finish(procs: list[tuple[subprocess.Popen, Path]]) -> None:
    failed = []
    for p, log in procs:
        try:
            rc = p.wait(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            failed.append(f"{log.name} (exit {rc}):\n" + log.read_text()[-3000:])
    if failed:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
        pytest.fail("\n".join(failed))


def flat(d: dict, prefix: str = "") -> dict:
    """A nested dict as {"a.b.c": leaf}."""
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def strip_seconds(x):
    """results.json without wall times (the only fields that may differ between the two jobs)."""
    if isinstance(x, dict):
        return {k: strip_seconds(v) for k, v in x.items() if "seconds" not in k}
    if isinstance(x, list):
        return [strip_seconds(v) for v in x]
    return x


def load_weights(policy_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(policy_dir / "model.safetensors"))


def cache_env(root: Path) -> dict:
    """A persistent compilation cache shared by the two-process jobs of this module (restarts skip compiling)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(root / "xla_cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def results(workdir: Path) -> dict:
    return strip_seconds(json.loads((workdir / "results.json").read_text()))


def weights_diff(a: Path, b: Path) -> float:
    """max |a - b| over the weights of two policy directories (same tensors required)."""
    wa, wb = load_weights(a), load_weights(b)
    assert wa.keys() == wb.keys()
    return max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)


def assert_same_job(a: Path, b: Path) -> None:
    """Two finished jobs of the same config on different process / device layouts agree: results.json
    equal up to wall times, training metrics to float32 rounding, final weights and the starting policy within 1e-5."""
    ra, rb = results(a), results(b)
    # training metrics are reductions over devices grouped differently: equal to float32 rounding. The share of
    # pairs with a positive reward margin is left out: after a few updates margins are ~1e-3, and a pair within
    # rounding of 0 may count on one side and not on the other
    ta, tb = ra["rounds"][1].pop("train"), rb["rounds"][1].pop("train")
    # the round's diagnostics read log-probs of the same pairs under weights that agree to float32 rounding, and
    # shares of pairs on one side of 0 (accuracies) as the training metrics above: counts and shares of sampled
    # leaves and steps must agree, the other figures to rounding
    da, db = flat(ra["rounds"][1].pop("diagnostics")), flat(rb["rounds"][1].pop("diagnostics"))
    assert ra == rb
    assert ta.keys() == tb.keys() and da.keys() == db.keys()
    for k in ta:
        if not k.endswith("accuracy"):
            np.testing.assert_allclose(np.asarray(tb[k], float), np.asarray(ta[k], float), rtol=1e-4, atol=1e-6)
    for k in da:
        if k.startswith("train_steps.") or k.endswith((".pairs", ".trees")):
            assert da[k] == db[k], k
        elif not k.endswith("accuracy") and da[k] is not None:
            np.testing.assert_allclose(db[k], da[k], rtol=1e-4, atol=1e-5, err_msg=k)
    for rel in ("rounds/1/policy", "start"):
        diff = weights_diff(a / rel, b / rel)
        assert diff <= 1e-5, f"{rel}: max |{a.name} - {b.name}| = {diff}"
