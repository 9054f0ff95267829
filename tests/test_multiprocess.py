"""Multi-process runs: ``ipl-jax run`` as two processes on this host (two CPU devices each, gloo collectives
between them) gives the same results and the same final parameters as one process with four devices; and a job
whose processes are killed (a preempted pod) resumes to the same results.

The reference jobs run at once in subprocesses (a shrunken ``synthetic:quick``: every stage, fewer steps and
splits); the two-process job's processes meet through ``--coordinator localhost:PORT``. Preemption: one process
of a two-process job is killed mid-SFT (after step 2's checkpoint save started, step 1's on disk) and, after a
restart of both, one mid-round (after its second T-DPO update); the other process must stop by itself, and the
job restarted once more ends with the uninterrupted two-process job's results and weights, bit for bit. An SFT
checkpoint written by two processes resumes on one, and one written by one process on two (other device counts,
so Orbax restores onto another mesh), to the same weights; the slow test does a whole job across 2 -> 1 -> 2
processes. Kills come from the test-only hook ``ipl_jax.fault_hook`` (``IPL_JAX_TEST_KILL_AT``). The jobs and the
comparison of two jobs are in ``support.multi_job``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from support.multi_job import (
    assert_same_job,
    cache_env,
    finish,
    free_port,
    launch_processes,
    results,
    weights_diff,
)

from ipl_jax import distributed
from ipl_jax.fault_hook import ENV as KILL_AT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiprocess")
    procs = launch_processes(root / "one", 1, 4, 0, root / "one")
    finish(procs + launch_processes(root / "two", 2, 2, free_port(), root / "two", env_extra=cache_env(root)))
    return root / "one", root / "two"


def test_two_processes_match_one(jobs):
    one, two = jobs
    res_one = json.loads((one / "results.json").read_text())
    res_two = json.loads((two / "results.json").read_text())
    assert len(res_one["rounds"]) == 2  # the starting policy and one IPL round
    assert res_two["rounds"][1]["pairs"] > 0  # the round trained on pairs
    assert_same_job(one, two)
    # the round moved the weights (so equal final weights are not just the starting policy's twice)
    assert weights_diff(one / "rounds/1/policy", one / "start") > 0


def test_only_the_main_process_writes_the_logs(jobs):
    one, two = jobs
    # one line per stage event in either job: the second process logged nothing
    events = lambda wd: [json.loads(x)["stage"] + json.loads(x)["event"] for x in (wd / "stage_log.jsonl").open()]
    assert events(two) == events(one)
    lines = lambda wd: (wd / "metrics.jsonl").read_text().count("\n")
    assert lines(two) == lines(one) > 0
    assert (two / "trees.html").is_file() and (two / "export" / "model.safetensors").is_file()


# ------------------------------------------------------------------------------------------------ preemption

HEARTBEAT = 15  # seconds: how long a process goes on after its peer died (IPL_JAX_HEARTBEAT_TIMEOUT)
RESUMED_SFT = "resuming SFT from its checkpoint at step 1"
# wall times, workdir paths and this invocation's throughput (``sft_stage.steady_rate``: a resumed run counts the
# tokens of its own steps)
SFT_TIMES = (
    "seconds",
    "train_seconds",
    "tokens_per_s",
    "candidates",
    "tokens",
    "first_step_seconds",
    "tokens_per_s_steady",
)


def kill_all(procs) -> None:
    for p, _ in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def preempt(procs, victim: int, timeout: float = 900) -> None:
    """Wait for process ``victim`` to die by its armed fault hook, then for the others to stop by themselves
    (a dead peer must not leave them waiting at a collective); anything else fails the test."""
    p, log = procs[victim]
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != -signal.SIGKILL or KILL_AT not in log.read_text():
        kill_all(procs)
        pytest.fail(f"{log.name}: expected the fault hook's SIGKILL, got exit {rc}:\n{log.read_text()[-3000:]}")
    deadline = time.monotonic() + 4 * HEARTBEAT
    for q, qlog in procs:
        try:
            rc = q.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_all(procs)
            pytest.fail(f"{qlog.name}: still running {4 * HEARTBEAT} s after its peer was killed")
        assert rc != 0, f"{qlog.name}: exited 0 although its peer was killed"


def sft_summary(workdir: Path) -> dict:
    done = json.loads((workdir / "stages" / "sft.done").read_text())
    return {k: v for k, v in done.items() if k not in SFT_TIMES}


def test_preempted_processes_resume_exactly(jobs, tmp_path):
    _, two = jobs
    wd, port = tmp_path / "preempted", free_port()
    env = {"IPL_JAX_HEARTBEAT_TIMEOUT": str(HEARTBEAT), **cache_env(two.parent)}
    # mid-SFT: process 1 dies right after starting step 2's checkpoint save (step 1's is on disk); process 0,
    # the coordinator, stops once the heartbeat times out
    preempt(launch_processes(wd, 2, 2, port, tmp_path / "sft", env_extra=env, kill={1: "sft_step=2"}), 1)
    assert (wd / "stages" / "model.done").is_file() and not (wd / "stages" / "sft.done").exists()
    # both restarted at the same address; mid-round: process 0 dies after two T-DPO updates, process 1 follows
    procs = launch_processes(wd, 2, 2, port, tmp_path / "round", env_extra=env, kill={0: "tdpo_step=2"})
    preempt(procs, 0)
    assert RESUMED_SFT in procs[0][1].read_text()
    assert (wd / "stages" / "eval_start.done").is_file() and not (wd / "stages" / "round_1.done").exists()
    # both restarted again: the job ends as the uninterrupted one did, bit for bit
    finish(launch_processes(wd, 2, 2, port, tmp_path / "end", env_extra=env))
    assert results(wd) == results(two)
    for rel in ("sft/candidates/step_000002", "start", "rounds/1/policy", "export"):
        assert weights_diff(wd / rel, two / rel) == 0.0, rel
    # the SFT summary covers the steps before the kill too (the last losses travel in the checkpoints)
    assert sft_summary(wd) == sft_summary(two)


def stopped_after_sft_step_1(src: Path, dst: Path) -> Path:
    """The workdir of a job stopped after SFT step 1, taken from the finished job ``src``: its config, the stages
    before SFT with their markers, and SFT's step-1 checkpoint as ``src``'s processes wrote it."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst)
    (dst / "stages").mkdir()
    for stage in ("data", "evolution", "model"):
        shutil.copytree(src / stage, dst / stage)
        shutil.copy(src / "stages" / f"{stage}.done", dst / "stages")
    shutil.copytree(src / "sft" / "checkpoints" / "1", dst / "sft" / "checkpoints" / "1")
    return dst


@pytest.mark.parametrize(
    "source, processes, devices",
    [("two", 1, 2), ("one", 2, 1)],
    ids=["2x2-to-1x2", "1x4-to-2x1"],
)
def test_sft_checkpoint_resumes_on_another_process_count(jobs, tmp_path, source, processes, devices):
    """An SFT checkpoint written by two processes (four devices) resumes in one process with two devices, and
    one written by one process (four devices) in two processes with one device each: Orbax restores the state
    onto the new mesh and the data iterator continues at batch 2, so step 2 gives the source's weights up to
    the rounding of a gradient reduced over other devices (without the iterator's position, step 2 would train
    on batch 1 again; without the restored Adam moments it would take another step)."""
    src = dict(zip(("one", "two"), jobs))[source]
    wd = stopped_after_sft_step_1(src, tmp_path / "resumed")
    procs = launch_processes(wd, processes, devices, free_port(), tmp_path / "resume", extra=["--stop-after", "sft"])
    finish(procs)
    assert RESUMED_SFT in procs[0][1].read_text()
    step2 = Path("sft", "candidates", "step_000002")
    diff = weights_diff(wd / step2, src / step2)
    assert diff <= 1e-5, f"{step2}: max |resumed - {source}| = {diff}"
    assert weights_diff(wd / step2, wd / "model" / "init") > 1e-4  # step 2 moved the weights (step 1: lr 0)
    mine, theirs = sft_summary(wd), sft_summary(src)
    for k in ("final_loss", "mean_loss_last_10"):
        np.testing.assert_allclose(mine.pop(k), theirs.pop(k), rtol=1e-5)
    assert mine == theirs


@pytest.mark.slow
def test_job_resumes_across_process_counts(jobs, tmp_path):
    """A whole job across 2 -> 1 -> 2 processes: two processes (two devices each) killed mid-SFT, one process
    (two devices) resuming SFT from their checkpoint and killed mid-round, two processes finishing; the results
    are the uninterrupted two-process job's (as one process's are: ``assert_same_job``)."""
    _, two = jobs
    wd = tmp_path / "moved"
    env = {"IPL_JAX_HEARTBEAT_TIMEOUT": str(HEARTBEAT), **cache_env(two.parent)}
    preempt(launch_processes(wd, 2, 2, free_port(), tmp_path / "sft", env_extra=env, kill={1: "sft_step=2"}), 1)
    procs = launch_processes(wd, 1, 2, 0, tmp_path / "round", kill={0: "tdpo_step=2"})
    preempt(procs, 0)
    assert RESUMED_SFT in procs[0][1].read_text()
    finish(launch_processes(wd, 2, 2, free_port(), tmp_path / "end", env_extra=env))
    assert_same_job(two, wd)


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
