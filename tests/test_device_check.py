"""The accelerator check script keeps working between GPU runs: its ``--cpu`` mode runs every part with tiny
sizes and writes the summary with each part's figures."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_device_check_cpu_mode_runs_every_part_and_summarizes(device_check_cpu):
    tmp_path = device_check_cpu
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = summary["parts"]
    assert {"env", "parity", "attention", "mfu", "sampler", "job"} <= set(parts), sorted(parts)
    for name, part in parts.items():
        assert part["rc"] == 0 and not part["timed_out"], (name, part)
    assert parts["env"]["cudnn_unavailable"].startswith("it needs a GPU")
    parity = parts["parity"]
    assert parity["impl"] == "xla" and parity["ok"] is True
    assert parity["decoder"]["logits_max_abs"] < 1e-4 < parity["decoder"]["logits_scale"]
    assert parity["packed"]["grad_cosine"] > 0.9999 and parity["sampler"]["greedy_tokens_equal"] is True
    mfu = parts["mfu"]
    assert mfu["attention_resolved"] == "reference" and mfu["step_s_median"] > 0
    profile = json.loads((tmp_path / "mfu.json").read_text())["profile"]
    assert {"attention", "mlp", "logprob_head", "optimizer"} <= set(profile["parts"])
    assert profile["parts"]["attention"]["backward"] > 0 and profile["total_ms"] > 0
    attention = json.loads((tmp_path / "attention.json").read_text())
    assert attention["decoder"]["impls"]["xla"]["max_abs_diff_out"] < 1e-4
    job = parts["job"]
    stages = [s["stage"] for s in job["stages"]]
    assert stages[0] == "data" and "sft" in stages and "round_1" in stages and stages[-1] == "export", stages
    assert job["sft"]["tokens"] > 0 and job["tdpo"][0]["tokens"] > 0 and job["run_exit"] == 0
