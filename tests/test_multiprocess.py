"""Multi-process runs: ``ipl-jax run`` as two processes on this host (two CPU devices each, gloo collectives
between them) gives the same results and the same final parameters as one process with four devices.

Both jobs run at once in subprocesses (a shrunken ``synthetic:quick``: every stage, fewer steps and splits);
the two-process job's processes meet through ``--coordinator localhost:PORT``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipl_jax import distributed

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent

# every stage of the job, with as little work per stage as keeps each one meaningful
SMALL = [
    "--config.data.train_episodes=8",
    "--config.data.test_splits=test",
    "--config.evolution.max_items=8",
    "--config.sft.steps=2",
    "--config.sft.checkpoint_every=1",
    "--config.seed_selection.steps=4",
    "--config.eval.max_steps=4",
    "--config.eval.blank_splits=",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(workdir: Path, devices: int, extra: list[str], log: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
        IPL_JAX_QUIET="1",
        IPL_JAX_INIT_TIMEOUT="120",
    )
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    args = [sys.executable, "-m", "ipl_jax.cli", "run", "--config", "synthetic:quick", "--workdir", str(workdir)]
    return subprocess.Popen(args + SMALL + extra, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


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


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiprocess")
    port = free_port()
    procs = [(launch(root / "one", 4, [], root / "one.log"), root / "one.log")]
    for i in range(2):
        flags = ["--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)]
        procs.append((launch(root / "two", 2, flags, root / f"two.{i}.log"), root / f"two.{i}.log"))
    finish(procs)
    return root / "one", root / "two"


def test_two_processes_match_one(jobs):
    one, two = jobs
    res_one = json.loads((one / "results.json").read_text())
    res_two = json.loads((two / "results.json").read_text())
    assert len(res_one["rounds"]) == 2  # the seed and one IPL round
    assert res_two["rounds"][1]["pairs"] > 0  # the round trained on pairs
    a, b = strip_seconds(res_one), strip_seconds(res_two)
    # training metrics are reductions over devices grouped differently: equal to float32 rounding. The share of
    # pairs with a positive reward margin is left out: after a few updates margins are ~1e-3, and a pair within
    # rounding of 0 may count on one side and not on the other
    ta, tb = a["rounds"][1].pop("train"), b["rounds"][1].pop("train")
    # the round's diagnostics read log-probs of the same pairs under weights that agree to float32 rounding, and
    # shares of pairs on one side of 0 (accuracies) as the training metrics above: counts and shares of sampled
    # leaves and steps must agree, the other figures to rounding
    da, db = flat(a["rounds"][1].pop("diagnostics")), flat(b["rounds"][1].pop("diagnostics"))
    assert a == b
    assert ta.keys() == tb.keys() and da.keys() == db.keys()
    for k in ta:
        if not k.endswith("accuracy"):
            np.testing.assert_allclose(np.asarray(tb[k], float), np.asarray(ta[k], float), rtol=1e-4, atol=1e-6)
    for k in da:
        if k.startswith("train_steps.") or k.endswith((".pairs", ".trees")):
            assert da[k] == db[k], k
        elif not k.endswith("accuracy") and da[k] is not None:
            np.testing.assert_allclose(db[k], da[k], rtol=1e-4, atol=1e-5, err_msg=k)
    # the final parameters (the round's policy) and the SFT seed
    for rel in ("rounds/1/policy", "seed"):
        wa, wb = load_weights(one / rel), load_weights(two / rel)
        assert wa.keys() == wb.keys()
        diff = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
        assert diff <= 1e-5, f"{rel}: max |one process - two processes| = {diff}"
    # the round moved the weights (so equal final weights are not just the seed's twice)
    moved = load_weights(one / "rounds/1/policy")
    seed = load_weights(one / "seed")
    assert max(float(np.max(np.abs(moved[k] - seed[k]))) for k in moved) > 0


def test_only_the_main_process_writes_the_logs(jobs):
    one, two = jobs
    # one line per stage event in either job: the second process logged nothing
    events = lambda wd: [json.loads(x)["stage"] + json.loads(x)["event"] for x in (wd / "stage_log.jsonl").open()]
    assert events(two) == events(one)
    lines = lambda wd: (wd / "metrics.jsonl").read_text().count("\n")
    assert lines(two) == lines(one) > 0
    assert (two / "trees.html").is_file() and (two / "export" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(coordinator="h:1", num_processes=2), "--process-id: missing"),
        (dict(coordinator="h", num_processes=2, process_id=0), "expected HOST:PORT"),
        (dict(coordinator="h:1", num_processes=2, process_id=2), "must be in 0..1"),
    ],
)
def test_bad_flags(flags, message):
    with pytest.raises(distributed.DistributedError, match=message):
        distributed.settings(**flags, env={})


def test_cluster_detection():
    assert distributed.settings(env={}) is None
    assert distributed.settings(env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None
    assert distributed.settings(env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}) == {}
    assert distributed.settings(env={"TPU_WORKER_HOSTNAMES": "localhost"}) is None
    assert distributed.settings(env={"TPU_WORKER_HOSTNAMES": "t0,t1"}) == {}
    env = {"JAX_COORDINATOR_ADDRESS": "h:9", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert distributed.settings(env=env) == {"coordinator_address": "h:9", "num_processes": 2, "process_id": 1}
