"""What the job hands over (``pipeline.export_stage``): the round chosen by dev, its scores against the starting
policy's in ``results.json["exported"]``, the closing printout; and ``step_accuracy.png``'s series over every test
split."""

from __future__ import annotations

import pytest

from ipl_jax.pipeline.export_stage import (
    RULE,
    choose_round,
    export_report,
    exported_block,
    is_evaluated,
    policy_scores,
)
from ipl_jax.viz.plots import plot_step_accuracy_splits, pooled_type_series, split_total_series

SPLITS = ("test", "test_app_unseen")


def _table(total: float, click: tuple[int, float | None], stop: tuple[int, float | None]) -> dict:
    return {
        "step_acc": total,
        "total": {"exact_acc": total},
        "CLICK": {"count": click[0], "exact_acc": click[1]},
        "STOP": {"count": stop[0], "exact_acc": stop[1]},
    }


def _rounds() -> list[dict]:
    start = {
        "round": 0,
        "dev": {"step_accuracy": 0.30},
        "metrics": {"test": _table(0.4, (3, 1 / 3), (1, 1.0)), "test_app_unseen": _table(0.2, (1, 0.0), (0, None))},
        "blank": {"test": {"step_acc": 0.1}},
        "online_splits": {"test": {"success_rate": 0.0}},
        "reading": {"test": {"page": 0.5, "texts": 0.25, "grounding": None}},
    }
    r1 = {"round": 1, "dev": {"step_accuracy": 0.35}, "metrics": {}}  # dev only (eval.every_round = false)
    r2 = {
        "round": 2,
        "dev": {"step_accuracy": 0.35},
        "metrics": {"test": _table(0.5, (2, 0.5), (2, 1.0)), "test_app_unseen": _table(0.4, (4, 0.25), (0, None))},
        "online_splits": {"test": {"success_rate": 0.25}},
        "reading": {"test": {"page": 0.75, "texts": 0.5, "grounding": 1.0}},
    }
    return [start, r1, r2]


def test_choose_round_takes_the_best_dev_and_the_later_round_on_a_tie():
    rounds = _rounds()
    assert choose_round(rounds) == 2  # rounds 1 and 2 tie at 35 %
    assert choose_round(rounds[:2]) == 1
    assert choose_round([{**rounds[0], "dev": {"step_accuracy": 0.9}}, *rounds[1:]]) == 0
    with pytest.raises(ValueError, match="no evaluated round"):
        choose_round([])
    assert is_evaluated(rounds[0]) and not is_evaluated(rounds[1]) and not is_evaluated({"round": 3})


def test_exported_block_names_the_round_and_its_scores_against_the_starting_policy():
    rounds = _rounds()
    block = exported_block(rounds, 2, False, SPLITS, {"episodes": 12, "steps": 64})
    assert block["round"] == 2 and block["rule"] == RULE and block["evaluated_at_export"] is False
    assert block["dev"] == {"episodes": 12, "steps": 64, "step_accuracy": [[0, 0.30], [1, 0.35], [2, 0.35]]}
    assert block["scores"]["step_accuracy"] == {"test": 0.5, "test_app_unseen": 0.4}
    assert block["scores"]["step_accuracy_mean"] == pytest.approx(0.45)
    assert block["start_scores"]["step_accuracy_mean"] == pytest.approx(0.3)
    assert block["gain"] == pytest.approx(0.15)
    assert block["start_scores"]["blank_step_accuracy"] == {"test": 0.1}
    assert block["scores"]["online_success"] == {"test": 0.25}
    assert block["scores"]["reading"]["test"]["page"] == 0.75
    # a round without test scores has no mean and no gain (a split missing counts as missing)
    empty = policy_scores(rounds[1], SPLITS)
    assert empty["step_accuracy"] == {"test": None, "test_app_unseen": None} and empty["step_accuracy_mean"] is None
    assert exported_block(rounds, 1, False, SPLITS, {"episodes": 12, "steps": 64})["gain"] is None


def test_export_report_says_which_round_why_and_against_the_starting_policy():
    block = exported_block(_rounds(), 2, True, SPLITS, {"episodes": 12, "steps": 64})
    lines = export_report(block).splitlines()
    assert lines[0].startswith("exported: round 2 (WORKDIR/export), by the best dev step accuracy")
    assert "on 12 dev episodes (64 steps): start 30.0%, round 1 35.0%, round 2 35.0% <-" in lines[0]
    assert "dev holds 12 episodes" in lines[1] and "may not be the best" in lines[2]
    assert "evaluated for the export" in lines[3] and lines[4].split() == ["start", "round", "2", "gain"]
    rows = {line[:30].strip(): line[30:].split() for line in lines[5:]}
    assert rows["test splits, mean"] == ["30.0", "45.0", "+15.0"]
    assert rows["test_app_unseen"] == ["20.0", "40.0", "+20.0"]
    assert rows["live world test"] == ["0.0", "25.0", "+25.0"]
    assert rows["grounding (test)"] == ["-", "100.0"]
    assert "dev holds" not in export_report({**block, "dev": {**block["dev"], "episodes": 100}})
    # an exported block of an older results.json (seed_scores) reads the same
    older = {("seed_scores" if k == "start_scores" else k): v for k, v in block.items()}
    assert export_report(older) == export_report(block)
    first = export_report(exported_block(_rounds(), 0, False, SPLITS, {"episodes": 12, "steps": 64})).splitlines()
    assert first[0].startswith("exported: the starting policy (WORKDIR/export)") and first[4].split() == [
        "start",
        "start",
        "gain",
    ]


def test_plot_series_cover_every_split_and_their_mean(tmp_path):
    rounds = _rounds()
    totals = split_total_series(rounds, SPLITS)
    assert totals["test"] == [0.4, None, 0.5] and totals["test_app_unseen"] == [0.2, None, 0.4]
    assert totals["mean"] == [pytest.approx(0.3), None, pytest.approx(0.45)]
    types = pooled_type_series(rounds, SPLITS)
    # round 0 CLICK: (3 x 1/3 + 1 x 0) / 4 steps; round 2: (2 x 0.5 + 4 x 0.25) / 6; STOP: splits without STOP skipped
    assert types["CLICK"] == [pytest.approx(0.25), None, pytest.approx(2 / 6)]
    assert types["STOP"] == [1.0, None, 1.0] and types["TYPE"] == [None, None, None]
    png = plot_step_accuracy_splits(rounds, SPLITS, tmp_path / "plot.png", exported=2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
