"""The main job end to end on the quick config: results.json schema, outputs, resume without redoing stages.

One module-scoped run (~2-3 min on two CPU cores) feeds every test here: it is made in two invocations (stop
after seed selection, then the rest), so the second invocation resuming after a finished stage is itself under
test; a third invocation must redo nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from ipl_jax.config import load_config
from ipl_jax.pipeline.run import STAGES, run_job

SCORE_KEYS = {"total", "CLICK", "TYPE", "SCROLL", "PRESS", "STOP", "parse_rate", "episode_success",
              "goal_progress", "steps", "episodes", "step_acc", "format", "rules"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    os.environ.setdefault("IPL_JAX_QUIET", "1")
    config = load_config("synthetic:quick")
    workdir = tmp_path_factory.mktemp("quick_job")
    lines: list[str] = []
    t0 = time.perf_counter()
    run_job(config, workdir, stop_after="seed", echo=lines.append)
    first = time.perf_counter() - t0
    run_job(config, workdir, echo=lines.append)
    return {"config": config, "workdir": Path(workdir), "lines": lines, "first_seconds": first}


def _stage_events(workdir: Path) -> list[dict]:
    return [json.loads(x) for x in (workdir / "stage_log.jsonl").read_text().splitlines() if x.strip()]


def test_results_schema(quick_run):
    config, workdir = quick_run["config"], quick_run["workdir"]
    results = json.loads((workdir / "results.json").read_text())
    rounds = results["rounds"]
    assert [r["round"] for r in rounds][:2] == [0, 1]
    assert len(rounds) == 1 + int(config.ipl.rounds)
    for r in rounds:
        assert set(r["metrics"]) == set(config.data.test_splits)
        for split, table in r["metrics"].items():
            assert SCORE_KEYS <= set(table), (split, sorted(table))
            # the table counts every step of the split, and accuracies are fractions
            assert table["steps"] == sum(t["count"] for k, t in table.items()
                                         if k in ("CLICK", "TYPE", "SCROLL", "PRESS", "STOP")) > 0
            assert 0.0 <= table["step_acc"] <= 1.0
        assert set(r["trees"]) == {"alpha", "beta", "gamma"}
        assert sum(r["trees"].values()) == pytest.approx(1.0)
        assert isinstance(r["pairs"], int) and r["pairs"] >= 0
        assert r["seconds"] > 0
    assert rounds[0]["pairs"] == 0
    # round 1 trained on pairs from its trees: a tree batch with no pair at all would mean nothing was learnt
    assert rounds[1]["pairs"] > 0


def test_scores_agree_with_the_predictions_file(quick_run):
    """results.json's tables are the `ipl-jax score` tables of the written predictions (re-scored here)."""
    from ipl_jax.evaluate import load_dataset, load_predictions
    from ipl_jax.metrics import score_episodes

    workdir = quick_run["workdir"]
    results = json.loads((workdir / "results.json").read_text())
    split = "test_app_unseen"
    preds_file = workdir / "eval" / "round_1" / f"{split}.predictions.jsonl"
    lines = [json.loads(x) for x in preds_file.read_text().splitlines()]
    as_predictions = workdir / "rescore.jsonl"
    as_predictions.write_text("".join(json.dumps({"episode_id": r["episode_id"], "step_id": r["step_id"],
                                                  "prediction": r["prediction"]}) + "\n" for r in lines))
    episodes = load_dataset(workdir / "data", "aitz", split)
    table = score_episodes(episodes, load_predictions(as_predictions), "aitz")
    assert table["step_acc"] == results["rounds"][1]["metrics"][split]["step_acc"]
    assert table["total"] == results["rounds"][1]["metrics"][split]["total"]


def test_outputs(quick_run):
    from PIL import Image

    from ipl_jax.model import load_params
    from ipl_jax.data.tokenizer import load_tokenizer

    workdir = quick_run["workdir"]
    with Image.open(workdir / "step_accuracy.png") as im:
        assert im.format == "PNG" and im.size[0] > 200
    page = (workdir / "trees.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    export = workdir / "export"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"):
        assert (export / name).is_file(), name
    params, cfg = load_params(str(export))
    tok = load_tokenizer(export)
    assert cfg.text.vocab_size >= len(tok)
    # the exported weights are the chosen round's policy, bit for bit
    chosen = json.loads((workdir / "stages" / "export.done").read_text())["exported_round"]
    src = workdir / ("seed" if chosen == 0 else f"rounds/{chosen}/policy")
    other, _ = load_params(str(src))
    import jax

    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(other)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    sft_lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    sft = [x for x in sft_lines if x.get("stage") == "sft"]
    assert [x["step"] for x in sft] == list(range(1, int(quick_run["config"].sft.steps) + 1))
    assert all(np.isfinite(x["loss"]) and x["tokens_per_s"] > 0 for x in sft)


def test_resume_skips_finished_stages(quick_run):
    config, workdir = quick_run["config"], quick_run["workdir"]
    events = _stage_events(workdir)
    started = [e["stage"] for e in events if e["event"] == "started"]
    # every stage ran exactly once over the two invocations (the second resumed after "seed")
    expected = [s for s in STAGES if s != "rounds"]
    expected.insert(expected.index("export"), "round_1")
    assert started == expected
    skipped = [e["stage"] for e in events if e["event"] == "skipped"]
    assert skipped == ["data", "evolution", "model", "sft", "seed"]
    before = (workdir / "results.json").read_text()
    n_events = len(events)
    lines: list[str] = []
    t0 = time.perf_counter()
    run_job(config, workdir, echo=lines.append)
    seconds = time.perf_counter() - t0
    new = _stage_events(workdir)[n_events:]
    assert {e["event"] for e in new} == {"skipped"}
    assert len(new) == len(expected)
    assert (workdir / "results.json").read_text() == before
    assert seconds < quick_run["first_seconds"] / 3
    assert any("already done" in line for line in lines)


def test_a_different_config_is_refused(quick_run):
    config = load_config("synthetic:quick", ["--config.sft.steps=9"])
    with pytest.raises(SystemExit, match="different config"):
        run_job(config, quick_run["workdir"], echo=lambda _: None)


def test_select_seed_command(quick_run, capsys):
    from ipl_jax.seed_selection import main

    workdir = quick_run["workdir"]
    candidates = sorted(str(p) for p in (workdir / "sft" / "candidates").iterdir())
    assert len(candidates) == 2
    out_json = workdir / "select.json"
    rc = main(["--checkpoints", *candidates, "--data", str(workdir / "data"), "--steps", "4",
               "--config", "synthetic:quick", "--json", str(out_json)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Acc_S" in printed and "<- seed" in printed
    got = json.loads(out_json.read_text())
    # the command reproduces the pipeline's own seed selection (same steps, keys and embedder)
    stage = json.loads((workdir / "stages" / "seed.done").read_text())
    assert [c["acc_s"] for c in got["candidates"]] == [c["acc_s"] for c in stage["candidates"]]
    assert [c["div_r"] for c in got["candidates"]] == pytest.approx([c["div_r"] for c in stage["candidates"]])
    assert Path(got["seed"]).name == stage["chosen"]
