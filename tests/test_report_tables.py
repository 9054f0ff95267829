"""The job's printed tables (``pipeline.report``): per-round, ablation, and the ablation's online / budget table."""

from __future__ import annotations


def _table(acc: dict) -> dict:
    t = {k.upper(): {"count": 1, "type_acc": 1.0, "exact_acc": v} for k, v in acc.items() if k != "total"}
    t["total"] = {"count": 5, "type_acc": 0.8, "exact_acc": acc["total"]}
    return t


def test_round_and_ablation_tables():
    from ipl_jax.pipeline.report import ablation_table, results_round, round_table

    r0 = results_round(
        0,
        {"test": _table({"click": 0.5, "type": 0.25, "scroll": None, "press": 1.0, "stop": 0.0, "total": 0.4})},
        {"alpha": 0.1, "beta": 0.3, "gamma": 0.6},
        0,
        12.3,
    )
    r1 = results_round(
        1,
        {"test": _table({"click": 0.75, "type": 0.5, "scroll": None, "press": 1.0, "stop": 0.5, "total": 0.6})},
        {"alpha": 0.2, "beta": 0.5, "gamma": 0.3},
        321,
        45.6,
    )
    text = round_table([r0, r1], "test").splitlines()
    assert text[0].split() == ["test", "start", "round", "1"]
    assert text[2].split() == ["click", "match", "50.00", "75.00"]
    assert text[4].split() == ["scroll", "match", "-", "-"]
    assert text[7].split() == ["total", "match", "40.00", "60.00"]
    assert text[9].split() == ["alpha", "trees", "10.00", "20.00"]
    assert text[12].split() == ["pairs", "0", "321"] and len(text) == 14
    r1 = {**r1, "samples": 32, "online": {"success_rate": 0.25, "success_ci95": [0.0715, 0.5907]}}
    text = round_table([{**r0, "online": {"success_rate": 0.0}}, r1], "test").splitlines()
    assert text[14].split() == ["samples", "0", "32"] and text[15].split() == ["online", "success", "0.00", "25.00"]
    assert text[16].split() == ["95%", "interval", "-", "7-59"]  # Wilson's for 2 of 8: 7.15% to 59.07%
    rows = [
        {"variant": "T-DPO (full)", "metrics": r1["metrics"], "pairs": 321},
        {"variant": "naive DPO", "metrics": r0["metrics"], "pairs": 7},
    ]
    lines = ablation_table(rows, "test").splitlines()
    assert lines[0].split() == ["variant", "click", "type", "scroll", "press", "stop", "total", "pairs"]
    assert lines[2].split() == ["T-DPO", "(full)", "75.00", "50.00", "-", "100.00", "50.00", "60.00", "321"]
    assert lines[3].split()[-2:] == ["40.00", "7"]


def test_online_budget_table():
    from ipl_jax.pipeline.report import online_budget_table

    rows = [
        {"variant": "starting policy", "online": {"success_rate": 0.25, "mean_steps": 5.5}, "samples": 0},
        {
            "variant": "GRPO (UI-R1)",
            "online": {"success_rate": 0.5, "mean_steps": 4.0},
            "samples": 32,
            "budget": 32,
            "updates": 1,
            "seconds": 12.4,
        },
        {"variant": "PPO", "samples": 40, "budget": 32, "updates": 6, "seconds": 30.6},  # online off
    ]
    lines = online_budget_table(rows).splitlines()
    assert lines[0].split() == ["variant", "online", "%", "steps", "samples", "budget", "updates", "seconds"]
    assert lines[2].split() == ["starting", "policy", "25.00", "5.50", "0", "-", "0", "0"]
    assert lines[3].split() == ["GRPO", "(UI-R1)", "50.00", "4.00", "32", "32", "1", "12"]
    assert lines[4].split() == ["PPO", "-", "-", "40", "32", "6", "31"]


def test_job_report_stages_rates_and_memory():
    from ipl_jax.pipeline.report import job_report, stage_table

    log = [
        {"stage": "data", "event": "started"},
        {"stage": "data", "event": "finished", "seconds": 1.0, "peak_device_bytes": None},
        {"stage": "sft", "event": "started"},  # a first attempt that stopped, then a resumed one that finished
        {"stage": "data", "event": "skipped", "seconds": 0.0},
        {"stage": "sft", "event": "started"},
        {"stage": "sft", "event": "finished", "seconds": 30.0, "peak_device_bytes": 7_000_000_000},
        {"stage": "round_1", "event": "started"},
        {"stage": "round_1", "event": "finished", "seconds": 20.0, "peak_device_bytes": 9_500_000_000},
        {"stage": "export", "event": "started"},
    ]
    sft = {
        "steps": 3,
        "tokens": 3000.0,
        "first_step_seconds": 20.0,
        "tokens_per_s": 120.0,
        "tokens_per_s_steady": 200.0,
    }
    tdpo = {
        "round": 1,
        "train": {"steps": 3, "tokens": 900.0, "first_step_tokens": 300.0, "seconds": 8.0, "first_step_seconds": 5.0},
        "seconds": {"sample_score_pairs": 4.0, "train": 8.0},
    }
    golden = {"round": 2, "train": {"steps": 2, "pairs": 8.0}}  # continued SFT: no T-DPO throughput
    rep = job_report(log, sft, [tdpo, golden], "1 x NVIDIA H200")
    assert [s["stage"] for s in rep["stages"]] == ["data", "sft", "round_1"]  # export never finished
    assert rep["seconds"] == 51.0 and rep["peak_device_bytes"] == 9_500_000_000
    assert rep["sft"]["tokens_per_s_steady"] == 200.0
    (t,) = rep["tdpo"]
    assert t["round"] == 1 and t["tokens_per_s"] == 900 / 8 and t["tokens_per_s_steady"] == 600 / 3
    text = stage_table(rep)
    assert "9.5 GB" in text and "1 x NVIDIA H200" in text and "T-DPO round 1: 3 steps, 900 tokens, 112 tokens/s" in text
    # one T-DPO step: no steady rate; a CPU (no memory statistics): no peak
    one = dict(tdpo, train=dict(tdpo["train"], steps=1, first_step_tokens=900.0, first_step_seconds=8.0))
    log_cpu = [dict(e, peak_device_bytes=None) if e["event"] == "finished" else e for e in log]
    rep = job_report(log_cpu, None, [one], "1 x cpu")
    assert rep["tdpo"][0]["tokens_per_s_steady"] is None and rep["peak_device_bytes"] is None and "sft" not in rep
    assert stage_table(rep).splitlines()[2].split() == ["data", "1.0", "-"]


def test_device_peak_bytes_reads_every_local_device(monkeypatch):
    import jax

    from ipl_jax.pipeline import workdir

    assert workdir.device_peak_bytes() is None  # the CPU backend keeps no memory statistics

    class Device:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    devices = [Device({"peak_bytes_in_use": 5, "bytes_in_use": 1}), Device({"peak_bytes_in_use": 9}), Device(None)]
    monkeypatch.setattr(jax, "local_devices", lambda: devices)
    assert workdir.device_peak_bytes() == 9


def test_round_table_reading_rows():
    """The reading scores of a split under the action rows, then with grey screenshots (with their Step.Acc) where
    the blank control ran; "-" for a score that does not apply or a round without it."""
    from ipl_jax.pipeline.report import results_round, round_table

    table = {"test": _table({"click": 0.5, "type": 0.25, "scroll": None, "press": 1.0, "stop": 0.0, "total": 0.4})}
    r0 = results_round(
        0,
        table,
        {},
        0,
        1.0,
        reading={"test": {"page": 0.8, "texts": 0.125, "grounding": None}},
        blank={"test": {"total": {"exact_acc": 0.2}}},
        blank_reading={"test": {"page": 0.1, "texts": 0.0, "grounding": 0.5}},
    )
    r1 = results_round(1, {}, {}, 3, 1.0)  # dev only: no test scores
    text = round_table([r0, r1], "test").splitlines()
    at = text.index(next(line for line in text if line.startswith("page named")))
    assert [line.split() for line in text[at : at + 7]] == [
        ["page", "named", "80.00", "-"],
        ["texts", "read", "12.50", "-"],
        ["grounding", "-", "-"],
        ["grey", "total", "match", "20.00", "-"],
        ["grey", "page", "named", "10.00", "-"],
        ["grey", "texts", "read", "0.00", "-"],
        ["grey", "grounding", "50.00", "-"],
    ]
    assert text[at - 1].startswith("total type")
    assert not [line for line in round_table([r0, r1], "other").splitlines() if "page named" in line]
