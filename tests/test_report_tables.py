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
    assert text[0].split() == ["test", "seed", "round", "1"]
    assert text[2].split() == ["click", "match", "50.00", "75.00"]
    assert text[4].split() == ["scroll", "match", "-", "-"]
    assert text[7].split() == ["total", "match", "40.00", "60.00"]
    assert text[9].split() == ["alpha", "trees", "10.00", "20.00"]
    assert text[12].split() == ["pairs", "0", "321"] and len(text) == 14
    r1 = {**r1, "samples": 32, "online": {"success_rate": 0.25}}
    text = round_table([{**r0, "online": {"success_rate": 0.0}}, r1], "test").splitlines()
    assert text[14].split() == ["samples", "0", "32"] and text[15].split() == ["online", "success", "0.00", "25.00"]
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
        {"variant": "seed policy", "online": {"success_rate": 0.25, "mean_steps": 5.5}, "samples": 0},
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
    assert lines[2].split() == ["seed", "policy", "25.00", "5.50", "0", "-", "0", "0"]
    assert lines[3].split() == ["GRPO", "(UI-R1)", "50.00", "4.00", "32", "32", "1", "12"]
    assert lines[4].split() == ["PPO", "-", "-", "40", "32", "6", "31"]
