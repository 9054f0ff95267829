"""A workdir made before the starting policy had its own word (``stages/seed.done``, ``stages/eval_seed.done``, the
policy in ``seed/``, those names in the stage log) reads under today's names and is written under them only; an
ablation's variants share an older base job's starting policy the same way. (The job resuming such a workdir end to
end: ``test_pipeline_run.py``.)"""

from __future__ import annotations

import json

from ipl_jax.pipeline.ablate import SHARED_DIRS, SHARED_STAGES, _share
from ipl_jax.pipeline.report import job_report
from ipl_jax.pipeline.workdir import Workdir, write_json


def _former_base(root):
    """A base job's workdir as written before the rename: the starting policy's stages done, its policy in seed/."""
    wd = Workdir(root, echo=lambda _: None)
    write_json(wd.path("stages", "sft.done"), {"seconds": 1.0})
    write_json(wd.path("stages", "seed.done"), {"chosen": "step_000004", "trees": {"alpha": 0.5}})
    write_json(wd.path("stages", "eval_seed.done"), {"metrics": {"test": {}}, "seconds": 2.0})
    wd.dir("seed").joinpath("model.safetensors").write_bytes(b"weights")
    for stage, event, seconds in (("seed", "started", None), ("seed", "finished", 3.0), ("eval_seed", "started", None)):
        wd.log_stage(stage, event, **({} if seconds is None else {"seconds": seconds}))
    wd.log_stage("eval_seed", "finished", seconds=4.0)
    return wd


def test_former_stage_markers_and_policy_directory_are_read_under_todays_names(tmp_path):
    wd = _former_base(tmp_path / "job")
    assert wd.is_done("start") and wd.is_done("eval_start")
    assert wd.summary("start")["chosen"] == "step_000004" and wd.summary("eval_start")["seconds"] == 2.0
    assert wd.found_marker("start") == wd.path("stages", "seed.done")
    assert wd.marker("start") == wd.path("stages", "start.done")  # where a marker is written: today's name
    assert wd.existing("start") == wd.path("seed") and wd.existing("start", "model.safetensors").is_file()
    assert wd.existing("sft") == wd.path("sft") and wd.existing("rounds", "1") == wd.path("rounds", "1")
    assert [e["stage"] for e in wd.stage_log()] == ["start", "start", "eval_start", "eval_start"]
    report = job_report(wd.stage_log(), None, [], "cpu")
    assert [(s["stage"], s["seconds"]) for s in report["stages"]] == [("start", 3.0), ("eval_start", 4.0)]
    # once today's names exist they win, and a run of a stage writes its marker under today's name
    write_json(wd.path("stages", "start.done"), {"chosen": "step_000008"})
    wd.dir("start")
    assert wd.summary("start")["chosen"] == "step_000008" and wd.existing("start") == wd.path("start")
    assert wd.run_stage("eval_start", lambda: {"never": "run"})["seconds"] == 2.0  # done under the former name
    assert not wd.path("stages", "eval_start.done").exists()


def test_variants_share_a_former_base_jobs_starting_policy(tmp_path):
    base = _former_base(tmp_path / "base")
    fresh = Workdir(tmp_path / "variants" / "tdpo", echo=lambda _: None)
    _share(base, fresh, SHARED_DIRS, SHARED_STAGES)
    assert fresh.path("start").resolve() == base.path("seed").resolve()
    assert json.loads(fresh.path("stages", "start.done").read_text())["chosen"] == "step_000004"
    assert fresh.is_done("eval_start") and not fresh.path("stages", "seed.done").exists()
    # a variant made before the rename (seed/ linked, seed.done copied) is left as it is
    older = Workdir(tmp_path / "variants" / "k2", echo=lambda _: None)
    older.path("seed").symlink_to(base.path("seed"), target_is_directory=True)
    write_json(older.path("stages", "seed.done"), base.summary("start"))
    _share(base, older, SHARED_DIRS, SHARED_STAGES)
    assert not older.path("start").exists() and not older.path("stages", "start.done").exists()
    assert older.existing("start") == older.path("seed") and older.is_done("eval_start")


def test_stop_after_takes_a_former_stage_name_with_a_notice(capsys):
    from ipl_jax.cli.run import parser

    assert parser().parse_args(["--workdir", "w", "--stop-after", "eval_seed"]).stop_after == "eval_start"
    assert capsys.readouterr().err.strip().splitlines() == [
        "ipl-jax run: --stop-after eval_seed is --stop-after eval_start now; the old name still works"
    ]
    assert parser().parse_args(["--workdir", "w", "--stop-after", "start"]).stop_after == "start"
    assert capsys.readouterr().err == ""
