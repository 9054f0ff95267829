"""Every script in ``tools/`` runs in its smallest mode, so that a rename in the package breaks a test rather than
the next benchmark run; each test checks what the script prints and writes.

Covered elsewhere: the accelerator scripts (``gpu_parity``, ``gpu_mfu`` with ``xla_profile``, ``bench_attention``,
``bench_sampler_gpu`` and its ``sampler_*`` parts, ``device_summary``) run in ``device_check.sh --cpu``
(test_device_check.py, test_bench_sampler_gpu.py), ``paper_job.sh`` in test_paper_job.py, ``harness`` in
test_tools_harness.py; ``test.sh``, the suite's own runner, is only parsed here.

The light scripts run in this process (``main(argv)``). The T-DPO step, the tree sampler, the step's pieces and the
TRL agreement compile the model's larger programs (``e2e``; the precision table compiles six of them: ``slow``):
they run as ``python -m tools.NAME`` in a process of their own, as a user runs them, apart from the suite's JAX
and torch state."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from support.commands import run_ok

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str, *args: str) -> str:
    """``python -m tools.NAME ARGS`` in its own process on one CPU device; returns what it printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(REPO)
    return run_ok([sys.executable, "-m", f"tools.{name}", *args], cwd=REPO, env=env, timeout=1200).stdout


def _ratio(text: str, label: str) -> float:
    """The number before ``x`` that follows ``label`` in the printed summary."""
    m = re.search(re.escape(label) + r"\s*([0-9.]+)x", text)
    assert m, (label, text[-2000:])
    return float(m.group(1))


# ------------------------------------------------------------------------------------------------ data and world


def test_bench_data_times_every_source_and_thread_count(tmp_path, capsys):
    from tools import bench_data

    out = tmp_path / "data.json"
    flags = ["--episodes", "2", "--batches", "2", "--batch-size", "2", "--shards", "1", "--json", str(out)]
    assert bench_data.main(flags) == 0
    res = json.loads(out.read_text())
    assert res["episodes"] == 2 and res["steps"] > 2
    rows = {(r["source"], r["threads"]): r for r in res["results"]}
    assert set(rows) == {(s, t) for s in bench_data.SOURCES for t in (1, 2)}
    for (source, _), r in rows.items():
        assert r["first_batch_s"] > 0 and r["steps_per_s"] == pytest.approx(2 * r["batches_per_s"])
        if source == "aitz":
            assert r["first_batch_ratio"] == r["steps_per_s_ratio"] == 1.0
    printed = capsys.readouterr().out
    assert "2 episodes" in printed and len(re.findall(r"^arrayrecord-source\s+[12]\s", printed, re.M)) == 2


def test_bench_synth_small_scale_writes_every_split(tmp_path, capsys):
    from ipl_jax.envs.synthetic import DEFAULT_SIZES
    from tools import bench_synth

    out, keep = tmp_path / "synth.json", tmp_path / "dataset"
    assert bench_synth.main(["--scale", "0.005", "--screens", "20", "--keep", str(keep), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["render"]["screens"] > 0 and res["render"]["render_per_s"] > 0
    d = res["dataset"]
    assert set(d["splits"]) == set(DEFAULT_SIZES) and d["steps"] >= d["episodes"] >= len(DEFAULT_SIZES)
    assert sum(d["action_shares"].values()) == pytest.approx(1.0, abs=0.01)
    assert 0 <= res["blind_click_accuracy"]["all_clicks"] <= 1
    assert all((keep / name).is_dir() for name in DEFAULT_SIZES)
    assert f"default dataset: {d['episodes']} episodes" in capsys.readouterr().out


def test_make_tiny_checkpoint_script_writes_a_loadable_model(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from ipl_jax.model.config import Qwen2VLConfig

    out = tmp_path / "ckpt"
    monkeypatch.setattr(sys, "argv", ["make_tiny_checkpoint.py", "--out", str(out), "--layers", "1"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(REPO / "tools" / "make_tiny_checkpoint.py"), run_name="__main__")
    assert e.value.code == 0
    cfg = Qwen2VLConfig.from_dir(out)
    assert cfg.text.num_hidden_layers == 1 and (out / "tokenizer.json").is_file()
    assert (out / "model.safetensors").is_file()
    assert f"image_token_id {cfg.image_token_id}" in capsys.readouterr().out


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "tools").glob("*.sh")))
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(REPO / "tools" / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------------ model benchmarks


@pytest.mark.e2e
def test_bench_tdpo_tiny_times_packed_unpacked_and_trl(tmp_path):
    out = tmp_path / "tdpo.json"
    printed = _tool("bench_tdpo", "--tiny", "--repeats", "1", "--json", str(out))
    res = json.loads(out.read_text())
    by = {r["variant"]: r for r in res["results"]}
    assert list(by) == ["packed", "unpacked", "trl"] and res["pairs_per_step"] == 5
    packed, unpacked = by["packed"], by["unpacked"]
    assert packed["rows"] == 2 and unpacked["rows"] == 7  # one row per prefix node / per continuation
    assert packed["pairs_per_s"] == pytest.approx(5 / (packed["step_s"] + packed["reference_s"]))
    assert res["ratio_vs_unpacked"] == pytest.approx(packed["pairs_per_s"] / unpacked["pairs_per_s"])
    assert unpacked["max_abs_ref_logp_diff_vs_packed"] < 1e-4
    assert _ratio(printed, "packed vs unpacked:") == pytest.approx(res["ratio_vs_unpacked"], abs=0.006)
    trl = by["trl"]
    if "skipped" in trl:  # TRL (the test extra) missing: the row says why
        assert trl["skipped"].startswith("cannot import TRL") and res["ratio_vs_trl"] is None
    else:
        assert trl["rows"] == 10 and trl["max_abs_ref_logp_diff_vs_packed"] < 1e-4
        assert res["ratio_vs_trl"] == pytest.approx(packed["pairs_per_s"] / trl["pairs_per_s"])
        assert _ratio(printed, "vs TRL: packed") == pytest.approx(res["ratio_vs_trl"], abs=0.006)


@pytest.mark.e2e
def test_bench_tree_tiny_against_no_sharing_and_transformers(tmp_path):
    out = tmp_path / "tree.json"
    flags = [] if _importable("torch") else ["--skip-transformers"]
    printed = _tool("bench_tree", "--tiny", "--json", str(out), *flags)
    res = json.loads(out.read_text())
    assert res["shape"] == "tiny" and res["leaves"] == 4 and res["branching"] == [2, 2, 1, 1]
    assert res["ours_leaves_per_s"] == pytest.approx(4 / res["ours_seconds"])
    assert 0 < res["useful_tflop"] and 0 < res["ours_flops_fraction_of_peak"]
    assert res["ratio_vs_no_sharing"] == pytest.approx(res["no_sharing_seconds"] / res["ours_seconds"])
    assert _ratio(printed, "ours is") == pytest.approx(res["ratio_vs_no_sharing"], abs=0.006)
    if flags:
        return
    assert res["ratio_vs_transformers"] == pytest.approx(res["transformers_seconds"] / res["ours_seconds"])
    assert "(c) transformers generate" in printed


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


@pytest.mark.slow
def test_bench_precision_tiny_table(tmp_path):
    out = tmp_path / "precision.json"
    printed = _tool("bench_precision", "--tiny", "--repeats", "1", "--json", str(out))
    rows = json.loads(out.read_text())
    variants = [(r["program"], r["dtype"], r["remat"]) for r in rows]
    want = [("tdpo_step", d, r) for d in ("float32", "bfloat16") for r in (False, True)]
    assert variants == want + [("sampler", "float32", False), ("sampler", "bfloat16", False)]
    assert all(r["seconds"] > 0 and r["total_mb"] > 0 and r["gflop"] > 0 for r in rows)
    assert abs(rows[2]["loss"] - rows[0]["loss"]) < 0.01 and rows[1]["loss"] == pytest.approx(rows[0]["loss"])
    assert len(re.findall(r"^tdpo_step\s", printed, re.M)) == 4


@pytest.mark.e2e
def test_bench_precision_tiny_profile(tmp_path):
    out = tmp_path / "profile.json"
    printed = _tool("bench_precision", "--profile", "--tiny", "--repeats", "1", "--json", str(out))
    rows = json.loads(out.read_text())
    pieces = {r["piece"] for r in rows}
    assert {"whole step", "decoder fwd+bwd", "vision fwd"} <= pieces
    assert {(r["layout"], r["piece"]) for r in rows} == {(lay, p) for lay in ("packed", "unpacked") for p in pieces}
    assert "packed: 2 rows" in printed


# ------------------------------------------------------------------------------------------------ TRL agreement


@pytest.mark.e2e
def test_tdpo_agreement_with_trl(tmp_path):
    """Our packed and unpacked T-DPO steps against TRL's ``DPOTrainer`` on the same weights and pairs: per-pair
    loss within 1e-4, gradient cosine >= 0.9999 (TRL comes with the test extra)."""
    out = tmp_path / "agreement.json"
    printed = _tool("bench_tdpo", "--agreement", "--tiny", "--json", str(out))
    agreement = json.loads(out.read_text())["trl_agreement"]
    assert "trl" not in agreement, agreement.get("trl")  # TRL ran
    assert agreement["pass"] is True and agreement["pairs"] == 5
    for name in ("packed_vs_trl", "unpacked_vs_trl", "packed_vs_unpacked"):
        row = agreement["comparisons"][name]
        assert row["max_abs_loss_diff"] <= 1e-4 and row["grad"]["cosine"] >= 0.9999, (name, row)
        assert row["grad"]["norm_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert set(agreement["per_pair"]) == {"packed", "unpacked", "trl"}
    assert printed.count("PASS") == 3 and "gradient cosine >= 0.9999: met" in printed
