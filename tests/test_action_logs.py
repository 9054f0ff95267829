"""Action logs from a second dataset (``data.action_root``): the synthetic world written in AndroidControl's layout
(``ipl-jax synth --format android_control``) reads back action for action, CoaT fields that are missing or empty
read as action-only, the data stage takes N annotated episodes from ``data.root`` and M logs from the action
root, and every bad mix of the two stops in one line before the data stage writes anything."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ipl_jax import cli
from ipl_jax.coat.actions import format_action
from ipl_jax.configs.loader import load_settings
from ipl_jax.data.aitz import load_aitz
from ipl_jax.data.android_control import load_android_control
from ipl_jax.data.dialogue import annotated_steps, has_coat
from ipl_jax.envs.synthetic import generate_split
from ipl_jax.envs.synthetic.android_control_writer import episode_example, shard_path
from ipl_jax.pipeline import data_stage
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.workdir import Workdir

REPO = Path(__file__).resolve().parent.parent


def synth(out: Path, split: str, episodes: int, seed: int, fmt: str = "aitz") -> None:
    argv = ["synth", "--out", str(out), "--split", split, "--episodes", str(episodes), "--seed", str(seed)]
    assert cli.main([*argv, "--format", fmt, "--png-level", "0"]) == 0


@dataclasses.dataclass(frozen=True)
class Roots:
    aitz: Path  # annotated: AITZ train 4 / dev 1 / test 1, seed 0
    logs: Path  # AndroidControl train 3, seed 1 (ids apart from aitz's)
    same_ids: Path  # AndroidControl train 2, seed 0: the ids of aitz's first training episodes
    no_train: Path  # AndroidControl holding only a validation split: an empty training split
    test_only: Path  # AITZ without a train folder
    checkpoint: Path  # what a job on published data is checked for before work (the bad mixes stop before it is read)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Roots:
    base = tmp_path_factory.mktemp("two_datasets")
    r = Roots(*(base / n for n in ("aitz", "logs", "same_ids", "no_train", "test_only", "checkpoint")))
    for split, n in (("train", 4), ("dev", 1), ("test", 1)):
        synth(r.aitz, split, n, 0)
    synth(r.logs, "train", 3, 1, "android_control")
    synth(r.same_ids, "train", 2, 0, "android_control")
    synth(r.no_train, "dev", 1, 2, "android_control")
    synth(r.test_only, "test", 1, 3)
    r.checkpoint.mkdir()
    (r.checkpoint / "config.json").write_text("{}")
    save_file({"w": np.zeros((2,), np.float32)}, str(r.checkpoint / "model.safetensors"))
    return r


# ------------------------------------------------------------------------------------- the AndroidControl writer


def test_android_control_written_by_synth_reads_back_action_for_action(tmp_path):
    out = tmp_path / "ac"
    synth(out, "train", 6, 2, "android_control")
    synth(out, "dev", 2, 2, "android_control")
    synth(out, "test_app_unseen", 2, 2, "android_control")
    with gzip.open(shard_path(out, "train"), "rb") as f:
        assert len(f.read(12)) == 12  # GZIP TFRecord framing
    written = generate_split("train", 6, seed=2)
    read = load_android_control(out, "train", high_level=False)
    assert [e.episode_id for e in read] == [e.episode_id for e in written]
    types = set()
    for ep, back in zip(written, read):
        # N screenshots, N-1 actions: the episode's final stop (on the last screenshot) has no AndroidControl action
        assert ep.steps[-1].action.type == "stop" and len(back.steps) == len(ep.steps) - 1
        assert back.instruction == ep.instruction
        for s, b in zip(ep.steps, back.steps):
            a, r = s.action, b.action
            w, h = s.screen_size
            types.add(a.type)
            assert (r.type, r.text, r.direction, r.button) == (a.type, a.text, a.direction, a.button), (a, r)
            assert b.screen_size == s.screen_size and b.history == s.history
            assert b.step_instruction == format_action(a)  # the action's text stands for the step instruction
            if a.point is not None:  # integer pixels, as published; target box and text from the a11y tree
                assert r.point == pytest.approx(a.point, abs=1 / min(w, h))
                assert r.box == pytest.approx(a.box, abs=1 / min(w, h)) and r.target == a.target
            assert b.coat is None
    assert {"click", "scroll", "type", "press"} <= types
    assert [e.episode_id for e in load_android_control(out, "validation")] == [
        e.episode_id for e in generate_split("dev", 2, seed=2)
    ]
    unseen = load_android_control(out, "test", subsplit="app_unseen")
    assert [e.episode_id for e in unseen] == [e.episode_id for e in generate_split("test_app_unseen", 2, seed=2)]
    splits = json.loads((out / "splits.json").read_text())
    assert {k: len(v) for k, v in splits.items()} == {"train": 6, "validation": 2, "test": 2}


def test_the_writer_needs_episodes_ending_with_their_only_stop():
    ep = generate_split("train", 1, seed=0)[0]
    with pytest.raises(ValueError, match=rf"episode {ep.episode_id}: .* must end with its only stop"):
        episode_example(dataclasses.replace(ep, steps=ep.steps[:-1]))
    with pytest.raises(ValueError, match="AndroidControl episode ids are integers"):
        episode_example(dataclasses.replace(ep, episode_id="ep1"))


def test_synth_android_control_bad_invocations_end_in_one_line(roots, tmp_path, capsys):
    argv = ["synth", "--out", str(roots.logs), "--split", "train", "--format", "android_control"]
    assert cli.main(argv) == 2
    assert cli.main([*argv, "--with-meta"]) == 2
    (tmp_path / "splits.json").write_text("{}")
    assert cli.main(["synth", "--out", str(tmp_path), "--format", "android_control"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    assert "shard android_control-train-00000-of-00001 already holds a split; pass --overwrite" in err[0]
    assert "--with-meta: the AndroidControl layout has no field for the step meta" in err[1]
    assert "holds an AndroidControl dataset not written by ipl-jax synth" in err[2]


# ---------------------------------------------------------------------------------------------- CoaT-less records


def test_aitz_steps_whose_coat_fields_are_missing_or_empty_read_as_action_only(tmp_path):
    root = tmp_path / "aitz"
    synth(root, "train", 4, 5)
    files = sorted(root.glob("train/*/*/*.json"))
    blanks = {0: "", 1: None, 2: "drop"}  # empty strings, nulls, no fields at all; episode 3 keeps its CoaT
    for k, value in blanks.items():
        records = json.loads(files[k].read_text())
        for rec in records:
            for field in ("coat_screen_desc", "coat_action_think", "coat_action_desc", "coat_action_result"):
                if value == "drop":
                    del rec[field]
                else:
                    rec[field] = value
        files[k].write_text(json.dumps(records))
    episodes = {Path(e.meta["file"]): e for e in load_aitz(root, "train")}
    for k, f in enumerate(files):
        steps = episodes[f].steps
        assert all(s.coat is None for s in steps) if k in blanks else all(has_coat(s) for s in steps)
    # annotated side: warm-up SFT leaves the CoaT-less steps out and counts them
    steps = [s for e in episodes.values() for s in e.steps]
    kept, left_out = annotated_steps(steps)
    assert left_out == sum(len(episodes[files[k]].steps) for k in blanks) and kept


# ---------------------------------------------------------------------------------------------- the data stage


def two_dataset_args(roots: Roots, *extra: str) -> list[str]:
    return [
        "--config.data.format=aitz",
        f"--config.data.root={roots.aitz}",
        "--config.data.test_splits=('test',)",
        "--config.eval.online_episodes=0",
        "--config.data.annotated_episodes=2",
        "--config.data.action_episodes=0",
        f"--config.data.action_root={roots.logs}",
        "--config.data.action_format=android_control",
        f"--config.model.checkpoint={roots.checkpoint}",
        *extra,
    ]


def test_annotated_episodes_from_the_root_and_action_logs_from_the_action_root(roots, tmp_path):
    settings = load_settings("synthetic:quick", two_dataset_args(roots))
    wd = Workdir(tmp_path / "job", echo=lambda _: None)
    splits = data_stage.load_splits(settings.data, wd, settings.seed)
    aitz_train = load_aitz(roots.aitz, "train")
    logs = load_android_control(roots.logs, "train")
    assert len(splits["train"]) == 2 and {e.episode_id for e in splits["train"]} < {e.episode_id for e in aitz_train}
    assert all(has_coat(s) for e in splits["train"] for s in e.steps)
    actions = splits[data_stage.ACTIONS]
    assert [e.episode_id for e in actions] == [e.episode_id for e in logs]  # M = 0: all of them, in reading order
    for e, full in zip(actions, logs):
        assert [s.action for s in e.steps] == [s.action for s in full.steps]
        assert all(s.coat is None and s.step_instruction is None and "file" not in s.meta for s in e.steps)
    assert data_stage.load_splits(settings.data, wd, settings.seed) == splits  # seeded
    some = load_settings("synthetic:quick", two_dataset_args(roots, "--config.data.action_episodes=2"))
    chosen = {
        seed: [e.episode_id for e in data_stage.load_splits(some.data, wd, seed)[data_stage.ACTIONS]]
        for seed in range(6)
    }
    assert (
        all(len(ids) == 2 and ids == sorted(ids, key=int) for ids in chosen.values())
        and len(set(map(tuple, chosen.values()))) > 1
    )


def test_oracle_reads_the_logs_annotations_back_from_the_action_root(roots, tmp_path):
    wd = Workdir(tmp_path / "job", echo=lambda _: None)
    annotated = tmp_path / "annotated_logs"
    synth(annotated, "train", 2, 1)  # the logs' episodes, CoaT included
    settings = load_settings(
        "synthetic:quick",
        two_dataset_args(roots, f"--config.data.action_root={annotated}", "--config.data.action_format=aitz"),
    )
    steps = data_stage.steps_of(data_stage.load_splits(settings.data, wd, settings.seed)[data_stage.ACTIONS])
    oracle = data_stage.oracle_steps(settings.data, wd, steps)
    assert [(s.episode_id, s.step_id) for s in oracle] == [(s.episode_id, s.step_id) for s in steps]
    assert all(has_coat(s) for s in oracle)
    ac = load_settings("synthetic:quick", two_dataset_args(roots))
    steps = data_stage.steps_of(data_stage.load_splits(ac.data, wd, ac.seed)[data_stage.ACTIONS])
    with pytest.raises(
        UsageError, match=r"logs: episode \d+ step 0 has no CoaT annotation in split 'train' \(androidcontrol\)"
    ):
        data_stage.oracle_steps(ac.data, wd, steps)


# ---------------------------------------------------------------------------------------------- bad mixes


BAD_MIXES = [
    (
        "missing action root",
        lambda r: two_dataset_args(r, f"--config.data.action_root={r.logs.parent / 'nope'}"),
        r"config\.data\.action_root='.*nope': no such directory",
    ),
    (
        "action root without a train split",
        lambda r: two_dataset_args(r, f"--config.data.action_root={r.test_only}", "--config.data.action_format=aitz"),
        r"config\.data\.action_root='.*test_only': no train split \(AITZ layout: ROOT/train/",
    ),
    (
        "action root whose train split is empty",
        lambda r: two_dataset_args(r, f"--config.data.action_root={r.no_train}"),
        r"config\.data\.action_root='.*no_train': its train split holds no episodes \(read as androidcontrol\)",
    ),
    (
        "unknown action format",
        lambda r: two_dataset_args(r, "--config.data.action_format=parquet"),
        r"config\.data\.action_format='parquet': must be a format holding golden actions: aitz, amex, androidcontrol",
    ),
    (
        "the synthetic world is no action format",
        lambda r: two_dataset_args(r, "--config.data.action_format=synthetic"),
        r"config\.data\.action_format='synthetic': must be a format holding golden actions",
    ),
    (
        "an action format without an action root",
        lambda r: two_dataset_args(r, "--config.data.action_root="),
        r"config\.data\.action_format='android_control': has no data\.action_root to read",
    ),
    (
        "more action episodes than the action root holds",
        lambda r: two_dataset_args(r, "--config.data.action_episodes=9"),
        r"config\.data\.action_episodes=9: exceeds the 3 training episodes of config\.data\.action_root='.*logs'",
    ),
    (
        "more annotated episodes than the root holds",
        lambda r: two_dataset_args(r, "--config.data.annotated_episodes=9"),
        r"config\.data\.annotated_episodes=9: exceeds the 4 training episodes of config\.data\.root='.*aitz'",
    ),
    (
        "the same episode in both datasets",
        lambda r: two_dataset_args(r, f"--config.data.action_root={r.same_ids}"),
        r"config\.data\.action_root='.*same_ids': episode 10000000000 is also in the train split of "
        r"config\.data\.root='.*aitz' \(2 shared episodes\)",
    ),
    (
        "the same episode in the synthetic world the job writes",
        lambda r: [
            "--config.data.annotated_episodes=6",
            f"--config.data.action_root={r.same_ids}",
            "--config.data.action_format=android_control",
        ],
        r"config\.data\.action_root='.*same_ids': episode 10000000000 is also in the train split of the synthetic "
        r"world",
    ),
    (
        "sft_oracle on logs published without CoaT",
        lambda r: two_dataset_args(r, "--config.ipl.method=sft_oracle"),
        r"config\.ipl\.method='sft_oracle' trains on the CoaT of the action logs, and config\.data\.action_root is "
        r"androidcontrol data",
    ),
]


@pytest.mark.parametrize("name, args, message", BAD_MIXES, ids=[m[0] for m in BAD_MIXES])
def test_bad_mixes_stop_in_one_line_before_the_data_stage_writes(roots, tmp_path, capsys, name, args, message):
    workdir = tmp_path / "job"
    argv = ["run", "--config", "synthetic:quick", "--workdir", str(workdir), "--stop-after", "data", *args(roots)]
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("ipl-jax run: ") and re.search(message, err[0]), err[0]
    assert not (workdir / "data").exists() and not (workdir / "stages" / "data.done").exists()


# ---------------------------------------------------------------------------------------------- the whole job


@pytest.mark.e2e
def test_one_round_on_android_control_logs_beside_annotated_aitz(tmp_path_factory):
    """``ipl-jax synth`` writes annotated AITZ and AndroidControl action logs; the quick job, started from the
    checkpoint a synthetic job made (a job on published data starts from one), warms up on 6 AITZ episodes and
    its round samples trees on the 8 logs."""
    base = tmp_path_factory.mktemp("two_dataset_job")
    aitz, logs, world, workdir = base / "aitz", base / "logs", base / "world", base / "job"
    for split, n in (("train", 6), ("dev", 2), ("test", 2)):
        synth(aitz, split, n, 0)
    synth(logs, "train", 8, 1, "android_control")
    log_ids = {e.episode_id for e in load_android_control(logs, "train")}
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        IPL_JAX_QUIET="1",
        JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "jax_compilation_cache"),
    )

    def run(*args: str) -> None:
        argv = [sys.executable, "-m", "ipl_jax.cli", "run", "--config", "synthetic:quick", *args]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    run("--workdir", str(world), "--stop-after", "model")  # a fresh model and tokenizer of the world's texts
    run(
        "--workdir",
        str(workdir),
        "--config.data.format=aitz",
        f"--config.data.root={aitz}",
        f"--config.data.action_root={logs}",
        "--config.data.action_format=android_control",
        "--config.data.annotated_episodes=6",
        "--config.data.action_episodes=0",
        "--config.data.test_splits=('test',)",
        "--config.eval.online_episodes=0",
        f"--config.model.checkpoint={world / 'model' / 'init'}",
    )
    data = json.loads((workdir / "stages" / "data.done").read_text())
    assert data["episodes"]["train"] == 6 and data["episodes"][data_stage.ACTIONS] == 8
    results = json.loads((workdir / "results.json").read_text())
    rounds = results["data"]["rounds"]
    assert rounds["kind"] == "action-only" and rounds["episodes"] == 8
    assert rounds["steps"] == sum(len(e.steps) for e in load_android_control(logs, "train"))
    first = results["rounds"][1]
    settings = load_settings("synthetic:quick")
    assert first["samples"] == settings.ipl.steps_per_round * 8  # the round sampled its trees (8 leaves each)
    trees = [json.loads(x) for x in (workdir / "rounds" / "1" / "trees.jsonl").read_text().splitlines()]
    assert trees and all(t["episode_id"] in log_ids for t in trees)  # on the action logs, not the AITZ episodes
