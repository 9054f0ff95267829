"""The main job with its workdir in a bucket of a real GCS API emulator (fake-gcs-server, ``support.gcs_emulator``):
``synthetic:quick`` end to end gives the local run's results.json (fixture ``quick_run``, wall times aside) and the
same policy files, its export loads in transformers, and a job killed mid-SFT resumes from the bucket's checkpoint
bit for bit. Each run keeps its host scratch in a directory of its own and starts in an empty directory, which
must stay empty (a URI read by ``pathlib`` would have written ``gs:/BUCKET/...`` there)."""

from __future__ import annotations

import json

import pytest
from support.quick_job import run_cli

from ipl_jax import storage
from ipl_jax.fault_hook import ENV as KILL_AT

QUICK = ["--config", "synthetic:quick"]
# the policy directories of the job, compared file by file with the local run's
POLICIES = ("model/init", "sft/candidates/step_000004", "sft/candidates/step_000008", "start", "export")


def _without_times(obj):
    """``obj`` without its wall times (keys ``seconds`` and ``*_seconds``)."""
    if isinstance(obj, dict):
        return {k: _without_times(v) for k, v in obj.items() if k != "seconds" and not k.endswith("_seconds")}
    if isinstance(obj, list):
        return [_without_times(v) for v in obj]
    return obj


def _host(bucket, tmp_path, name: str, **extra) -> tuple[dict, object]:
    """(environment, working directory) of one host of the job: the emulator's variables, a scratch of its own."""
    cwd = tmp_path / name / "cwd"
    cwd.mkdir(parents=True)
    return {**bucket.env, storage.SCRATCH_ENV: str(tmp_path / name / "scratch"), **extra}, cwd


def _files(root) -> dict[str, bytes]:
    """Every file under the local directory ``root`` by its relative name."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.e2e
def test_the_whole_job_in_a_bucket_equals_the_local_run(quick_run, gcs_bucket, tmp_path, monkeypatch):
    uri, local = f"{gcs_bucket.uri}/run", quick_run["workdir"]
    env, cwd = _host(gcs_bucket, tmp_path, "host")
    proc = run_cli(["run", *QUICK, "--workdir", uri], quick_run["cache"], env=env, cwd=cwd)
    assert f"results: {uri}/results.json" in proc.stdout
    assert list(cwd.iterdir()) == []

    remote = json.loads(storage.as_path(f"{uri}/results.json").read_text())
    assert _without_times(remote) == _without_times(json.loads((local / "results.json").read_text()))
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "reader"))  # another host reads the bucket
    for name in POLICIES:
        assert _files(storage.local_dir(f"{uri}/{name}")) == _files(local / name), name
    done = [p.name for p in storage.as_path(f"{uri}/stages").iterdir()]
    assert sorted(done) == sorted(p.name for p in (local / "stages").iterdir())

    # the export in the bucket, downloaded, loads in transformers with the weights the job trained
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    export = storage.local_dir(f"{uri}/export")
    model = AutoModelForImageTextToText.from_pretrained(export, torch_dtype="auto")
    ours = {k: v for f in export.glob("*.safetensors") for k, v in load_file(f).items()}
    loaded = model.state_dict()
    embed = next(v for k, v in ours.items() if k.endswith("embed_tokens.weight"))
    assert any(torch.equal(embed, v) for k, v in loaded.items() if k.endswith("embed_tokens.weight"))


@pytest.mark.e2e
def test_a_job_killed_mid_sft_resumes_from_the_bucket_bit_for_bit(quick_run, gcs_bucket, tmp_path, monkeypatch):
    uri, local = f"{gcs_bucket.uri}/killed", quick_run["workdir"]
    args = ["run", *QUICK, "--workdir", uri, "--stop-after", "sft"]
    env, cwd = _host(gcs_bucket, tmp_path, "first", **{KILL_AT: "sft_step=7"})
    killed = run_cli(args, quick_run["cache"], env=env, cwd=cwd, ok=False)
    assert killed.returncode == -9 and "killing process" in killed.stderr, killed.stderr[-3000:]
    assert not storage.as_path(f"{uri}/stages/sft.done").exists()
    assert [p.name for p in storage.as_path(f"{uri}/sft/checkpoints").iterdir()] == ["4"]

    env, cwd = _host(gcs_bucket, tmp_path, "second")  # restarted on another host: nothing of the first's disk
    again = run_cli(args, quick_run["cache"], env=env, cwd=cwd)
    assert "resuming SFT from its checkpoint at step 4" in again.stdout
    assert list(cwd.iterdir()) == []
    summary = json.loads(storage.as_path(f"{uri}/stages/sft.done").read_text())
    expected = json.loads((local / "stages" / "sft.done").read_text())
    for key in ("final_loss", "mean_loss_last_10", "items", "steps"):
        assert summary[key] == expected[key], key
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "reader"))
    for name in POLICIES[1:3]:  # the candidates: every byte of the weights as the uninterrupted run's
        assert _files(storage.local_dir(f"{uri}/{name}")) == _files(local / name), name
