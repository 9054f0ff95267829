"""The ``buckets`` stage (``pipeline/buckets_stage.py``): a length over a largest bucket is found before training, from
the data the job reads; the job adds a bucket for it, or with ``buckets.fixed`` stops with one line naming the
example, its length, the largest bucket and the flag. Data that fit leave every bucket as configured."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from ipl_jax import cli
from ipl_jax.configs.loader import load_settings
from ipl_jax.pipeline.buckets_stage import (
    LengthScan,
    Longest,
    apply,
    describe,
    fit,
    read_fitted,
    round_up,
    scan,
    tdpo_row_bound,
)
from ipl_jax.pipeline.paths import UsageError

QUICK = load_settings("synthetic:quick", [])  # tokens (384,), patches (128,), prefix / prompt (128,), rows (640,)


def _fitting() -> list[Longest]:
    """Longest lengths that fit the quick config's buckets (the SFT and patch ones at their largest bucket)."""
    return [
        Longest("buckets.tokens", 384, "1/0"),
        Longest("buckets.patches", 128, "1/0"),
        Longest("sampler.tree.prefix_buckets", 65, "1/0"),
        Longest("sampler.tree.prompt_buckets", 98, "2/3"),
        Longest("ipl.text_buckets", 393, "2/4"),
    ]


# ------------------------------------------------------------------------------------------------ the decision


def test_scan_keeps_the_longest_length_and_its_first_example():
    lengths = LengthScan()
    for length, name in ((300, "a/0"), (420, "b/1"), (420, "c/2"), (10, "d/3")):
        lengths.add("buckets.tokens", length, name)
    lengths.add("buckets.patches", 128, "a/0")
    assert lengths.longest == {
        "buckets.tokens": Longest("buckets.tokens", 420, "b/1"),
        "buckets.patches": Longest("buckets.patches", 128, "a/0"),
    }
    with pytest.raises(ValueError, match="unknown bucket field 'buckets.max_turn_tokens'"):
        lengths.add("buckets.max_turn_tokens", 1, "a/0")


def test_data_that_fit_change_no_bucket():
    longest = _fitting()
    assert fit(QUICK, longest) == {}
    assert apply(QUICK, {"changed": {}}) is QUICK and apply(QUICK, None) is QUICK
    line = describe(QUICK, {x.field: x for x in longest}, {})
    assert line.startswith("  buckets: the data fit (SFT token length 384 <= 384,") and "\n" not in line


def _leaves(d: dict, prefix: str = "") -> dict:
    """Nested settings as ``{"section.field": value}``, sections within sections included."""
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_a_length_over_the_largest_bucket_adds_one_rounded_up():
    assert [round_up(n) for n in (1, 64, 65, 420, 448)] == [64, 64, 128, 448, 448]
    longest = _fitting()
    longest[0] = Longest("buckets.tokens", 420, "10077000021/5")
    longest[3] = Longest("sampler.tree.prompt_buckets", 129, "7/2")
    changed = fit(QUICK, longest)
    assert changed == {"buckets.tokens": [384, 448], "sampler.tree.prompt_buckets": [128, 192]}
    fitted = apply(QUICK, {"changed": changed})
    assert fitted.buckets.tokens == (384, 448) and fitted.sampler.tree.prompt_buckets == (128, 192)
    # everything else as configured: the settings differ in exactly these two fields
    a, b = _leaves(QUICK.to_dict()), _leaves(fitted.to_dict())
    assert {k for k in a if a[k] != b[k]} == {"buckets.tokens", "sampler.tree.prompt_buckets"}
    line = describe(QUICK, {x.field: x for x in longest}, changed)
    assert "buckets.tokens + 448 (SFT token length 420 of example 10077000021/5 > 384)" in line
    assert "sampler.tree.prompt_buckets + 192 (turn prompt length 129 of example 7/2 > 128)" in line


def test_fixed_buckets_stop_with_one_line_naming_the_example_its_length_and_the_flag():
    fixed = QUICK.replace({"buckets.fixed": True})
    assert fit(fixed, _fitting()) == {}  # data that fit pass
    longest = _fitting()
    longest[0] = Longest("buckets.tokens", 420, "10077000021/5")
    with pytest.raises(UsageError) as e:
        fit(fixed, longest)
    assert str(e.value) == (
        "SFT token length of example 10077000021/5 is 420, over the largest bucket 384 of config.buckets.tokens "
        "(fix it with --config.buckets.tokens=(384,448), or let the job add it: --config.buckets.fixed=false)"
    )


def test_the_workdirs_fitted_buckets_are_read_back(tmp_path):
    with pytest.raises(UsageError, match="no finished buckets stage"):
        read_fitted(tmp_path)
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "buckets.done").write_text(json.dumps({"changed": {"ipl.text_buckets": [640, 704]}}))
    assert apply(QUICK, read_fitted(tmp_path)).ipl.text_buckets == (640, 704)


# ----------------------------------------------------------------------------------------------- the lengths


def test_tdpo_row_bound_on_hand_made_lengths():
    """Prefix 60, prompts 40 / 8 / 6, golden action 9 and grounding 20 tokens, branching (2, 2, 2, 1), budgets
    (64, 36, 10, 22). Turn t's row: the prefix less one, s_l and prompt l+1 for l < t, b_t budgets (+ golden)."""
    ipl = QUICK.ipl  # gamma_pairs "paper", every turn paired
    args = (60, (40, 8, 6), {3: 9, 4: 20}, (2, 2, 2, 1), (64, 36, 10, 22))
    t1 = 59 + 2 * 64
    t2 = 59 + (64 + 40) + 2 * 36
    t3 = 59 + (64 + 40) + (36 + 8) + 2 * 10 + 9
    t4 = 59 + (64 + 40) + (36 + 8) + (10 + 6) + 22 + 20
    assert (t1, t2, t3, t4) == (187, 235, 236, 265)
    assert tdpo_row_bound(*args, ipl) == 265
    assert tdpo_row_bound(*args, dataclasses.replace(ipl, gamma_pairs="none")) == max(t3 - 9, t4 - 20)
    assert tdpo_row_bound(*args, dataclasses.replace(ipl, pair_turns=(1, 2))) == t2
    assert tdpo_row_bound(*args, dataclasses.replace(ipl, method="naive_dpo")) == 59 + 2 * (132 + 54)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A make-tiny checkpoint (its own tokenizer, not the job's BPE) and a few synthetic steps written as AITZ."""
    from ipl_jax.data.datasets import load_dataset
    from ipl_jax.data.tiny import make_tiny_checkpoint
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
    from ipl_jax.envs.synthetic.dataset import generate_split

    root = tmp_path_factory.mktemp("bucket_fit")
    ckpt = make_tiny_checkpoint(root / "ckpt", seed=0)
    write_aitz_split(generate_split("train", 2, seed=0), root / "data", "train")
    steps = [s for e in load_dataset(root / "data", "aitz", "train") for s in e.steps]
    return ckpt, steps


def test_scan_measures_what_the_loader_and_the_sampler_build(tiny):
    """The scan's lengths (header grids, stand-in pixels) equal those of the examples and prompts built from the
    decoded screenshots, and its T-DPO bound is the length of a row packed at full budgets."""
    from ipl_jax.coat.actions import needs_grounding
    from ipl_jax.data.dialogue import coat_example, golden_action_texts, qa_example
    from ipl_jax.data.evolution import QA
    from ipl_jax.data.image_processing import ImageProcessorConfig
    from ipl_jax.data.tokenizer import IM_END, load_tokenizer
    from ipl_jax.model.config import Qwen2VLConfig
    from ipl_jax.pipeline.sft_stage import SFTItem
    from ipl_jax.preference.grouping import _step_prefix
    from ipl_jax.preference.packed_batch import PrefixGroup
    from ipl_jax.preference.packing import _row
    from ipl_jax.sampling.prompts import step_prompts

    ckpt, steps = tiny
    tok, ic, cfg = load_tokenizer(ckpt), ImageProcessorConfig.load(ckpt), Qwen2VLConfig.from_dir(ckpt)
    qa = QA(steps[1].episode_id, steps[1].step_id, 1, "page_description", "What is this page?", "A settings page.")
    items = [SFTItem(s) for s in steps] + [SFTItem(steps[1], qa)]
    click = next(i for i, s in enumerate(steps) if needs_grounding(s.action))
    settings = QUICK.replace({"ipl.pair_turns": (4,)})
    lengths = scan(settings, tok, ic, steps, items, steps[click : click + 1]).longest

    sft = [len(coat_example(s, tok, ic)) for s in steps]
    sft.append(len(qa_example(tok, ic, steps[1].load_image(), qa.question, qa.answer)))
    longest = steps[int(np.argmax(sft))]
    prompts = [step_prompts(s, tok, ic, cfg) for s in steps]
    assert lengths["buckets.tokens"] == Longest("buckets.tokens", max(sft), f"{longest.episode_id}/{longest.step_id}")
    assert lengths["buckets.patches"].length == max(int(np.prod(p.image_grid_thw, axis=1).max()) for p in prompts)
    assert lengths["sampler.tree.prefix_buckets"].length == max(len(p.prefix_ids) for p in prompts)
    assert lengths["sampler.tree.prompt_buckets"].length == max(len(q) for p in prompts for q in p.turn_prompt_ids)

    # the click step's turn-4 group at full budgets: s1..s3 in its prefix, b4 sampled groundings and the golden one
    budgets, b4, p = settings.buckets.max_turn_tokens, settings.sampler.tree.branching[3], prompts[click]
    prefix, _ = _step_prefix(p, 4, [np.full(n, tok.ids.pad, np.int32) for n in budgets[:3]])
    golden = np.asarray(tok.encode(golden_action_texts(steps[click])[4] + IM_END), np.int32)
    sampled = tuple(np.arange(1, budgets[3] + 1, dtype=np.int32) + k for k in range(b4))
    group = PrefixGroup(prefix, (*sampled, golden), p.pixel_values, p.image_grid_thw)
    assert lengths["ipl.text_buckets"].length == len(_row(cfg, group, 0)[0])


# ------------------------------------------------------------------------------------------- the user's run


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    """The user's run at small sizes: AITZ episodes written by ``ipl-jax synth --split all`` and a ``make-tiny``
    checkpoint (its tokenizer is not the job's BPE, so the dialogues are longer: 229 to 390 tokens here, where a
    bucket of 320 stands in for the default's 384 of the user's run)."""
    root = tmp_path_factory.mktemp("user_run")
    assert cli.main(["synth", "--out", str(root / "data"), "--split", "all", "--episodes", "12"]) == 0
    assert cli.main(["make-tiny", "--out", str(root / "ckpt")]) == 0
    return root


def _job(root, workdir, *extra) -> list[str]:
    return [
        "run",
        "--config",
        "synthetic:quick",
        f"--config.model.checkpoint={root / 'ckpt'}",
        "--config.data.format=aitz",
        f"--config.data.root={root / 'data'}",
        "--config.data.action_episodes=0",  # every training episode annotated
        "--config.eval.online_episodes=0",  # the live world is the synthetic job's
        "--config.buckets.tokens=(320,)",
        "--workdir",
        str(workdir),
        "--stop-after",
        "sft",
        *extra,
    ]


def _stages(workdir) -> list[str]:
    return sorted(p.name.removesuffix(".done") for p in (workdir / "stages").glob("*.done"))


@pytest.mark.e2e
def test_fixed_buckets_stop_the_job_before_warm_up_sft(user_data, tmp_path, capsys):
    workdir = tmp_path / "job"
    capsys.readouterr()
    assert cli.main(_job(user_data, workdir, "--config.buckets.fixed=true")) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    m = re.fullmatch(
        r"ipl-jax run: SFT token length of example (\d+/\d+) is (\d+), over the largest bucket 320 of "
        r"config\.buckets\.tokens \(fix it with --config\.buckets\.tokens=\(320,(\d+)\), or let the job add it: "
        r"--config\.buckets\.fixed=false\)",
        line,
    )
    assert m, line
    assert int(m[2]) > 320 and int(m[3]) == round_up(int(m[2]))
    # stopped before warm-up SFT: nothing trained, no checkpoint written
    assert _stages(workdir) == ["data", "evolution", "model"]
    assert not (workdir / "sft").exists()
    assert not any(json.loads(x)["stage"] == "sft" for x in (workdir / "stage_log.jsonl").read_text().splitlines())


@pytest.mark.e2e
def test_the_users_run_fits_its_buckets_and_trains(user_data, tmp_path, capsys):
    from ipl_jax.pipeline.run import Job
    from ipl_jax.pipeline.workdir import Workdir

    workdir = tmp_path / "job"
    capsys.readouterr()
    assert cli.main(_job(user_data, workdir)) == 0
    out = capsys.readouterr().out
    fitted = read_fitted(workdir)
    longest = fitted["longest"]["buckets.tokens"]
    assert longest["length"] > 320 and longest["largest_bucket"] == 320
    assert fitted["changed"] == {"buckets.tokens": [320, round_up(longest["length"])]}  # the rest fit as configured
    assert f"buckets grown to fit the data: buckets.tokens + {round_up(longest['length'])} " in out
    assert f"(SFT token length {longest['length']} of example {longest['example']} > 320)" in out
    assert _stages(workdir) == ["buckets", "data", "evolution", "model", "sft"]
    assert json.loads((workdir / "stages" / "sft.done").read_text())["steps"] == 8
    # resumed, the job takes the buckets it fitted from the stage's summary (nothing is measured again)
    settings = load_settings("synthetic:quick", _job(user_data, workdir)[3:-4])
    job = Job(settings, Workdir(workdir, echo=lambda *_: None))
    for stage in ("data", "evolution", "model", "buckets"):
        getattr(job, stage)()
    assert job.settings.buckets.tokens == (320, round_up(longest["length"]))
    assert job.settings.replace({"buckets.tokens": (320,)}) == settings


@pytest.mark.e2e
def test_the_synthetic_jobs_data_fit_its_buckets(tmp_path, capsys):
    """The synthetic job keeps its buckets (so its shapes and results are as before the stage existed)."""
    assert cli.main(["run", "--config", "synthetic:quick", "--workdir", str(tmp_path), "--stop-after", "buckets"]) == 0
    assert "  buckets: the data fit (SFT token length " in capsys.readouterr().out
    fitted = read_fitted(tmp_path)
    assert fitted["changed"] == {} and set(fitted["longest"]) == {
        "buckets.tokens",
        "buckets.patches",
        "sampler.tree.prefix_buckets",
        "sampler.tree.prompt_buckets",
        "ipl.text_buckets",
    }
