"""Scarce annotations (``synthetic:scarce``): N annotated training episodes, M others read as action logs. The
logs' annotations reach nothing the job reads (only the ``sft_oracle`` upper bound reads them back), supervised
paths refuse steps without CoaT, and bad splits or variants stop with one line before any work."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ipl_jax.coat.actions import Action
from ipl_jax.configs.loader import load_settings
from ipl_jax.data.records import CoaT, Episode, Step
from ipl_jax.pipeline import data_stage
from ipl_jax.pipeline.paths import UsageError


def _episodes(n: int) -> list[Episode]:
    def step(e: int, k: int) -> Step:
        return Step(
            episode_id=f"ep{e}",
            step_id=k,
            instruction=f"task {e}",
            image=b"",
            screen_size=(4, 8),
            action=Action("scroll", direction="down"),
            coat=CoaT(screen_desc=f"screen {e}/{k}", action_think=f"thought {e}/{k}"),
            step_instruction=f"scroll {e}/{k}",
            meta={"dataset": "aitz", "file": f"/data/ep{e}.json", "step_id": k},
        )

    return [
        Episode(f"ep{e}", f"task {e}", tuple(step(e, k) for k in range(2)), meta={"dataset": "aitz", "file": "f"})
        for e in range(n)
    ]


def test_split_annotations_keeps_n_annotated_and_strips_m_action_logs():
    eps = _episodes(10)
    annotated, logs = data_stage.split_annotations(eps, 3, 5, seed=0)
    ids = [e.episode_id for e in annotated], [e.episode_id for e in logs]
    assert len(ids[0]) == 3 and len(ids[1]) == 5 and not set(ids[0]) & set(ids[1])
    assert all(ids[k] == sorted(ids[k], key=lambda x: int(x[2:])) for k in (0, 1))  # reading order kept
    assert annotated == [e for e in eps if e.episode_id in ids[0]]  # as read, annotations and all
    for e in logs:
        assert "file" not in e.meta
        for s in e.steps:
            assert s.coat is None and s.step_instruction is None and s.meta == {"dataset": "aitz", "step_id": s.step_id}
            assert s.action == Action("scroll", direction="down") and s.instruction == e.instruction
    assert data_stage.split_annotations(eps, 3, 5, seed=0) == (annotated, logs)  # seeded
    assert [e.episode_id for e in data_stage.split_annotations(eps, 3, 5, seed=1)[0]] != ids[0]
    for n, m in ((0, 5), (3, 8), (-1, 2)):
        with pytest.raises(UsageError, match=r"data.annotated_episodes=.* must be >= 1 annotated .* 10 training"):
            data_stage.split_annotations(eps, n, m, seed=0)


SMALL = [
    "--config.data.train_episodes=9",
    "--config.data.dev_episodes=2",
    "--config.data.test_episodes=1",
    "--config.data.test_splits=test",
    "--config.data.png_level=0",
    "--config.data.annotated_episodes=3",
    "--config.data.action_episodes=5",
]


def test_action_logs_carry_no_annotation_into_anything_the_job_reads(tmp_path, monkeypatch):
    """Every training thought and description of the synthetic world gets a marker naming its step; the
    job's splits, the steps the rounds sample, a fresh tokenizer's corpus, warm-up SFT's items and the
    continued-SFT control see the markers of the annotated episodes only. ``oracle_steps`` (``sft_oracle``) reads
    those of the action logs back from the dataset; supervised training handed the logs refuses them."""
    from ipl_jax.pipeline.model_stage import tokenizer_corpus
    from ipl_jax.pipeline.rounds_stage import golden_steps, golden_update_fn, round_steps
    from ipl_jax.pipeline.run import Job
    from ipl_jax.pipeline.sft_stage import sft_items
    from ipl_jax.pipeline.workdir import Workdir

    generate = data_stage.generate_split

    def marked(name, n, seed=0, config=None):
        eps = generate(name, n, seed=seed, config=config)
        if name != "train":
            return eps

        def mark(e, s):
            tag = f" MARK{e.episode_id}x{s.step_id}"
            return dataclasses.replace(
                s, coat=CoaT(screen_desc=s.coat.screen_desc + tag, action_think=s.coat.action_think + tag)
            )

        return [dataclasses.replace(e, steps=tuple(mark(e, s) for s in e.steps)) for e in eps]

    monkeypatch.setattr(data_stage, "generate_split", marked)  # where the data stage calls it
    config = load_settings("synthetic:quick", SMALL)
    wd = Workdir(tmp_path / "job", echo=lambda _: None)
    job = Job(config, wd)
    job.data()
    annotated, logs = job.splits["train"], job.splits[data_stage.ACTIONS]
    assert len(annotated) == 3 and len(logs) == 5
    marks = {
        name: [f"MARK{e.episode_id}x{s.step_id}" for e in eps for s in e.steps]
        for name, eps in (("annotated", annotated), ("logs", logs))
    }
    assert job.train_steps == data_stage.steps_of(annotated) and job.round_pool == data_stage.steps_of(logs)

    def seen(*objects) -> str:
        return repr(objects)

    held = seen(job.splits, job.train_steps, job.round_pool, round_steps(job.round_pool, config, 1))
    corpus = "\n".join(tokenizer_corpus(job.corpus_steps()))
    items, skipped = sft_items(job.train_steps + job.round_pool, [])
    control_settings = config.replace({"ipl.method": "continued_sft"})
    control = golden_steps(control_settings, wd, round_steps(job.round_pool, config, 1), job.train_steps)
    assert skipped == len(job.round_pool) and [i.step for i in items] == job.train_steps
    for text in (held, corpus, seen([i.step for i in items]), seen(control)):
        assert not any(m in text for m in marks["logs"])
    for text in (held, corpus, seen(control)):
        assert all(m in text for m in marks["annotated"])
    assert all(s.coat is None for s in round_steps(job.round_pool, config, 1))
    oracle_settings = config.replace({"ipl.method": "sft_oracle"})
    oracle = golden_steps(oracle_settings, wd, job.round_pool[:4], job.train_steps)
    assert [(s.episode_id, s.step_id) for s in oracle] == [(s.episode_id, s.step_id) for s in job.round_pool[:4]]
    assert all(m in seen(oracle) for m in marks["logs"][:4])
    with pytest.raises(UsageError, match=r"ipl.method='tdpo'.* 4 of the 4 steps .* carry no CoaT"):
        golden_update_fn(config, None, job.round_pool[:4], None)


def _cli(args: list[str], capsys) -> tuple[int, str]:
    from ipl_jax.cli import ablate, run

    main = {"ablate": ablate.main, "run": run.main}[args[0]]
    rc = main(args[1:])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config.data.annotated_episodes=0"], "config.data.annotated_episodes=0: leaves no annotated episode"),
        (["--config.data.action_episodes=280"], "config.data.action_episodes=280: with 30 annotated episodes exceeds"),
        (["--config.data.action_episodes=-3"], "config.data.action_episodes=-3: must be >= 0"),
        (["--config.data.dev_split=", "--config.data.dev_holdout=10"], "exceeds the 290 training episodes"),
    ],
)
def test_scarce_splits_out_of_range_stop_in_one_line_before_any_work(tmp_path, capsys, args, message):
    workdir = tmp_path / "ablate"
    rc, err = _cli(["ablate", "--config", "synthetic:scarce", "--workdir", str(workdir), *args], capsys)
    assert rc == 2 and message in err and len(err.splitlines()) == 1 and not workdir.exists()


def test_a_variant_that_needs_the_logs_annotations_without_logs_stops_in_one_line(tmp_path, capsys):
    workdir = tmp_path / "ablate"
    rc, err = _cli(
        ["ablate", "--config", "synthetic:full", "--workdir", str(workdir), "--variants", "tdpo,sft_oracle"], capsys
    )
    assert rc == 2 and len(err.splitlines()) == 1 and not workdir.exists()
    assert "config.ipl.method='sft_oracle': trains on the CoaT of action-only episodes" in err


def test_scarce_variant_settings():
    from ipl_jax.pipeline.ablate import variant_settings

    c = load_settings("synthetic:scarce")
    assert c == load_settings("synthetic")  # the default job is the scarce setting ("scarce": its former name)
    assert (c.data.annotated_episodes, c.data.action_episodes) == (30, 270) and c.ipl.rounds == c.ablation.rounds
    assert c.ablation.variants == ("tdpo", "no_negatives", "continued_sft", "sft_oracle")
    # the default keeps the blank-screen control and the live world, on seen and unseen tasks
    assert c.eval.blank_splits == ("test",) and c.eval.online_episodes > 0
    assert c.eval.online_splits == ("test", "test_task_unseen")
    full = load_settings("synthetic:full")  # the former default: every training episode annotated
    assert (full.data.annotated_episodes, full.data.action_episodes) == (0, 0) and not full.data.scarce
    assert variant_settings(c, "sft_oracle").ipl.method == "sft_oracle"
    assert c.eval.every_round is False and c.ipl.selection.type_balance == 1.0


QUICK_SCARCE = [
    "--config.data.train_episodes=24",
    "--config.data.annotated_episodes=6",
    "--config.data.action_episodes=18",
    "--config.data.dev_episodes=4",
    "--config.data.test_episodes=4",
    "--config.evolution.max_items=48",
    "--config.model.text.num_hidden_layers=2",
    "--config.model.text.vocab_size=1024",
    "--config.buckets.tokens=(384,)",
    "--config.sampler.tree.prefix_buckets=(128,)",
    "--config.sampler.tree.prompt_buckets=(128,)",
    "--config.ipl.text_buckets=(640,)",
    "--config.sft.steps=8",
    "--config.sft.batch_size=4",
    "--config.sft.micro_batch_size=4",
    "--config.sft.checkpoint_every=4",
    "--config.sft.warmup_steps=2",
    "--config.start_selection.steps=4",
    "--config.start_selection.embedder=tfidf",
    "--config.sampler.tree.branching=(2,2,2,1)",
    "--config.ipl.rounds=2",
    "--config.ablation.rounds=2",
    "--config.ipl.steps_per_round=4",
    "--config.ipl.batch_size=4",
    "--config.ipl.diagnostic_steps=2",
    "--config.ipl.heldout_steps=2",
    "--config.ipl.gamma_pairs=paper",
    "--config.ipl.selection.type_balance=0.0",  # 4 steps a round: keep every pair, so each variant has updates
    "--config.eval.batch_size=4",
]


@pytest.mark.slow
def test_ablate_scarce_quick(tmp_path):
    """``ipl-jax ablate --config synthetic:scarce`` with the quick job's sizes: the five variants from one starting
    policy, two rounds each; in round 1 they sample the same trees and pairs (only the update differs), the supervised
    controls spend T-DPO's update budget, every round explains itself and is evaluated on test."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "ablate"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent), IPL_JAX_QUIET="1")
    variants = "tdpo,no_negatives,naive_dpo,continued_sft,sft_oracle"
    args = ["ablate", "--config", "synthetic:scarce", "--workdir", str(root), "--variants", variants, *QUICK_SCARCE]
    proc = subprocess.run(
        [sys.executable, "-m", "ipl_jax.cli", *args], env=env, capture_output=True, text=True, timeout=3000
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "what each round did" in proc.stdout
    rows = {r["variant"]: r for r in json.loads((root / "ablation.json").read_text())["rows"]}
    assert set(rows) == {"start", "tdpo", "no_negatives", "naive_dpo", "continued_sft", "sft_oracle"}
    first = {
        v: json.loads((root / "variants" / v / "rounds" / "1" / "round.json").read_text()) for v in rows if v != "start"
    }
    for v in ("no_negatives", "continued_sft", "sft_oracle"):
        assert first[v]["pairs"] == first["tdpo"]["pairs"] and first[v]["batches"] == first["tdpo"]["batches"]
        assert (
            first[v]["diagnostics"]["train_pairs"]["accuracy_before"]
            == first["tdpo"]["diagnostics"]["train_pairs"]["accuracy_before"]
        )
    for v in ("continued_sft", "sft_oracle"):
        assert first[v]["train"]["steps"] == first["tdpo"]["train"]["steps"] > 0
    for v, row in rows.items():
        if v == "start":
            continue
        assert row["rounds"] == 2 and len(row["diagnostics"]) == 2 and row["gain"]["low"] <= row["gain"]["high"]
        assert all(d["train_steps"]["steps"] == 2 for d in row["diagnostics"])
        # an ablation variant evaluates every round on test (eval.every_round), so any round can be compared
        results = [json.loads((root / "variants" / v / "stages" / f"round_{r}.done").read_text()) for r in (1, 2)]
        for result in results:
            assert set(result["metrics"]) == {"test", "test_app_unseen", "test_task_unseen"}
