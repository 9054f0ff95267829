"""``python -m tools.bench_sampler_gpu`` in its CPU mode (``--size tiny``): every part runs in one subprocess, as on an
accelerator, and its figures follow from the tree's shapes (rows and cache slots per level, bytes a decode step
reads, leaves per batch); ``--time-limit`` stops the run with the partial JSON; bad flags are one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STEPS = 2


def _bench():
    from tools import bench_sampler_gpu  # the repository root is on sys.path under ``python -m pytest``

    return bench_sampler_gpu


def _run(tmp_path, *flags, timeout=600):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench_sampler_gpu", "--size", "tiny", "--steps", str(STEPS), "--json", str(out)]
        + list(flags),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, (json.loads(out.read_text()) if out.is_file() else None)


@pytest.fixture(scope="module")
def report(device_check_cpu):
    """The sampler part of ``tools/device_check.sh --cpu`` (run once per session; ``conftest.device_check_cpu``),
    with ``--decode-options`` and ``--profile`` on."""
    pytest.importorskip("torch")
    return json.loads((device_check_cpu / "sampler.json").read_text())


@pytest.mark.e2e
def test_every_part_runs_and_the_tree_has_27_leaves_per_step(report):
    bench = _bench()
    assert report["parts_done"] == list(bench.PARTS)
    assert report["errors"] == {} and report["stopped"] is None
    assert report["branching"] == [3, 3, 3, 1]
    assert report["leaves"] == report["tree"]["leaves"] == 27 * STEPS
    tree = report["tree"]
    assert report["leaves_per_s"] == pytest.approx(27 * STEPS / tree["warm_s"])
    assert 0 < tree["warm_s"] < tree["first_call_s"] and 0 < tree["compile_s"] < tree["first_call_s"]
    grid = report["grid"]
    assert report["patches_per_step"] == grid[0] * grid[1] * grid[2]
    assert report["image_tokens_per_step"] * 4 == report["patches_per_step"]
    assert report["prefix_tokens"] == 5 + 6 + 2 + report["image_tokens_per_step"]  # text, vision start / end


@pytest.mark.e2e
def test_decode_turns_have_the_tree_shapes_and_bytes(report):
    bench = _bench()
    cfg = bench.model_config("tiny", "bfloat16", "reference")
    t = cfg.text
    h, dq, dkv = t.hidden_size, t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    layer = h * (dq + 2 * dkv) + (dq + 2 * dkv) + dq * h + 3 * h * t.intermediate_size + 2 * h
    weights = 2 * (t.num_hidden_layers * layer + h + t.vocab_size * h)  # bf16; the head (or tied embedding)
    kv = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2
    assert report["decode_weight_bytes"] == weights and report["kv_bytes_per_token"] == kv

    p, (q2, q3, _) = report["prefix_tokens"], report["prompt_tokens"]
    t1, t2, t3, _ = report["turn_tokens"]
    want = {
        "turn1": dict(rows=STEPS * 3, slots=p + t1, context=p - 1, budget=t1),
        "turn3": dict(rows=STEPS * 27, slots=p + t1 + q2 + t2 + q3 + t3, context=p - 1 + t1 + q2 + t2 + q3, budget=t3),
    }
    dec = report["decode"]
    assert sorted(dec) == sorted(want)
    for name, shape in want.items():
        d = dec[name]
        assert {k: d[k] for k in shape} == shape, name
        assert d["bytes_per_step"] == weights + d["rows"] * (d["context"] + (d["budget"] + 1) / 2) * kv
        assert d["step_s"] == pytest.approx(d["turn_s"] / d["budget"])
        assert d["bound_s"] == pytest.approx(d["bytes_per_step"] / report["hbm_bytes_per_s"])
        assert d["bound_over_step"] == pytest.approx(d["bound_s"] / d["step_s"])
        # a tiny model's step is dispatch, not memory traffic: far below its bound on a CPU
        assert 0 < d["bound_over_step"] < 1, name
    total = sum(d["bound_s"] * d["budget"] for d in dec.values()) / sum(d["turn_s"] for d in dec.values())
    assert report["decode_bound_ratio"] == pytest.approx(total)
    assert report["decode_options"] == {"xla_cpu_enable_fast_math": False}  # the last turn, compiled again
    assert "options_step_s" not in dec["turn1"]
    assert dec["turn3"]["options_bound_over_step"] == pytest.approx(
        dec["turn3"]["bound_s"] / dec["turn3"]["options_step_s"]
    )
    prof = report["decode_profile"]  # the last timed turn's kernels
    assert prof["turn"] == 3 and prof["total_ms"] > 0 and 0 < prof["busy_fraction"]
    assert prof["top_ops"] and "attention" in prof["parts"]


@pytest.mark.e2e
def test_prefill_mfu_and_the_transformers_ratio(report):
    pre = report["prefill"]
    assert pre["rows"] == STEPS and pre["tokens"] == STEPS * (report["prefix_tokens"] - 1)
    assert 0 < pre["vision_tflop"] < pre["model_tflop"]
    assert pre["mfu"] == pytest.approx(pre["model_tflop"] * 1e12 / pre["s"] / report["peak_flops"])
    assert report["prefill_mfu"] == pre["mfu"] and 0 < pre["mfu"] < 1
    hf = report["transformers"]
    assert hf["attn_implementation"] == "sdpa" and hf["dtype"] == "bfloat16"
    assert hf["leaves_per_s"] == pytest.approx(27 * STEPS / hf["s"])
    assert report["ratio_vs_transformers"] == pytest.approx(hf["s"] / report["tree"]["warm_s"])


@pytest.mark.e2e
def test_time_limit_stops_the_run_and_keeps_the_json(tmp_path):
    proc, res = _run(tmp_path, "--time-limit", "0.5", "--skip-transformers", timeout=120)
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert res["stopped"].startswith("time limit reached during ")
    assert "tree" not in res["parts_done"] and res["wall_s"] < 30


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--turns", "4,4"], "--turns"),
        (["--parts", "tree,render"], "--parts: unknown render"),
        (["--decode-turns", "5"], "--decode-turns"),
        (["--screen", "wide"], "--screen"),
        (["--decode-options", "fast"], "--decode-options"),
    ],
)
def test_bad_flags_are_one_line(flags, message):
    with pytest.raises(SystemExit) as e:
        _bench().main(["--size", "tiny", *flags])
    assert str(e.value).startswith(message)
