"""tools/harness.py, the benchmarks' shared harness: timing, compiled memory as ``ipl-jax plan`` counts it,
peaks, the matmul peak and JSON output (imported as ``tools.harness`` from the repository root)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from ipl_jax.planning.programs import ProgramPlan

harness = pytest.importorskip("tools.harness")  # the repository root is on sys.path under ``python -m pytest``


def test_timings_warm_up_then_time_each_repeat():
    calls = []

    def fn(x):
        calls.append(x)
        return x + 1

    times = harness.timings(fn, jnp.ones(3), warmup=2, repeats=3)
    assert len(calls) == 5 and len(times) == 3 and all(t >= 0 for t in times)
    assert harness.best_time(fn, 1.0, warmup=0, repeats=2) <= harness.median_time(fn, 1.0, warmup=0, repeats=1) + 1
    out, seconds = harness.timed(fn, jnp.zeros(2))
    assert out.tolist() == [1.0, 1.0] and seconds >= 0
    s = harness.summary([3.0, 1.0, 2.0])
    assert s == {"min_s": 1.0, "median_s": 2.0, "all_s": [3.0, 1.0, 2.0]}


def test_compiled_memory_is_what_plan_counts():
    x = jnp.ones((64, 64), jnp.float32)
    compiled = jax.jit(lambda a: (a @ a).sum(axis=0)).lower(x).compile()
    mem = harness.compiled_memory(compiled)
    assert mem["arguments"] == 64 * 64 * 4 and mem["outputs"] == 64 * 4
    sizes = {k: mem[k] for k in ("arguments", "outputs", "aliased", "temporaries")}
    plan = ProgramPlan("p", "", **sizes, flops=0.0, xla_flops=0.0, unknown_loops=0, compile_s=0.0, inputs={})
    assert mem["total"] == plan.total == mem["arguments"] + mem["outputs"] + mem["temporaries"] - mem["aliased"]


def test_peaks_and_json(tmp_path):
    assert harness.rss_peak_bytes() > 1 << 20
    peak = harness.device_peak_bytes()
    assert peak is None or peak >= 0
    assert harness.matmul_peak(jnp.float32, n=64, reps=2, products=2) > 0
    path = tmp_path / "sub" / "out.json"
    text = harness.write_json(path, {"a": 1.5})
    assert json.loads(path.read_text()) == {"a": 1.5} and path.read_text() == text
