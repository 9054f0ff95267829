"""``tools/paper_job.sh --cpu``: the paper config's job on a random checkpoint of the 2B layout (shrunk) and
synthetic AITZ data drawn at a phone-like resolution, every stage once, every training program compiled once,
with its job report.

Minutes on a 2-core CPU (mostly compiles), hence ``slow``; the accelerator runs the same script at full size.
"""

import json
import os
import sys
from pathlib import Path

import pytest
from support.commands import run_ok

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_paper_job_cpu_runs_every_stage_and_reports(tmp_path):
    out = tmp_path / "job"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(REPO), IPL_JAX_QUIET="1", JAX_LOG_COMPILES="1")
    proc = run_ok(
        ["bash", str(REPO / "tools" / "paper_job.sh"), "--out", "job", "--cpu", "--json", "copy/job.json"],
        cwd=tmp_path,
        env=env,
        timeout=1800,
    )
    report = json.loads((out / "job.json").read_text())
    assert json.loads((tmp_path / "copy" / "job.json").read_text()) == report and report["run_exit"] == 0
    stages = [s["stage"] for s in report["stages"]]
    assert stages == [
        "data",
        "evolution",
        "model",
        "buckets",
        "sft",
        "start",
        "eval_start",
        "round_1",
        "eval_export",
        "export",
    ]
    assert all(s["seconds"] >= 0 for s in report["stages"]) and report["seconds"] > 0
    assert report["peak_device_bytes"] is None and report["device"].endswith("cpu")  # CPUs count no memory
    assert report["sft"]["steps"] == 2 and report["sft"]["tokens"] > 0 and report["sft"]["tokens_per_s"] > 0
    (tdpo,) = report["tdpo"]
    assert tdpo["round"] == 1 and tdpo["tokens"] > 0 and tdpo["tokens_per_s"] > 0
    assert report["init_model_seconds"] > 0 and report["run_seconds"] >= report["seconds"] - 1
    assert "stage" in proc.stdout and "T-DPO round 1:" in proc.stdout  # the printed stage table
    # single buckets: the SFT step and the T-DPO update compile once each (the second step reuses the first's)
    for program in ("jit(step)", "jit(_tdpo_update)"):
        assert proc.stderr.count(f"Finished XLA compilation of {program}") == 1, program

    # the run was the paper config on the written data and checkpoint
    config = json.loads((out / "run" / "config.json").read_text())
    assert config["data"]["format"] == "aitz" and config["model"]["remat"] == "full"
    assert config["sft"]["lora_rank"] == 128 and config["ipl"]["lora_rank"] == 64
    assert config["model"]["checkpoint"] == str(out / "model") and config["data"]["root"] == str(out / "data")
    init = json.loads((out / "run" / "model" / "init" / "config.json").read_text())
    assert init["dtype"] == "bfloat16"  # the starting checkpoint is copied in its own dtype, not widened
    results = json.loads((out / "run" / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [0, 1] and results["rounds"][1]["pairs"] > 0
    assert (out / "run" / "export" / "config.json").is_file()

    from PIL import Image

    shots = sorted((out / "data" / "train").glob("*/*/*.png"))
    assert shots and all(Image.open(p).size == (270, 600) for p in shots[:5])
