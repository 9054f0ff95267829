"""The main job end to end on the quick config: results.json schema, outputs, resume without redoing stages.

One run of the session (fixture ``quick_run``, ``support.quick_job``: about 2 min on two busy CPU cores when the
notebook test has filled the shared compilation cache) feeds the job tests here: it is made in two invocations
(``ipl-jax sft``, then ``ipl-jax run``), so the second invocation resuming after a finished stage is itself under
test; a third invocation must redo nothing.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from support.quick_job import REPO, run_cli

from ipl_jax.configs.loader import load_settings
from ipl_jax.pipeline.ablate import variant_settings
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.run import STAGES, run_job

SCORE_KEYS = {
    "total",
    "CLICK",
    "TYPE",
    "SCROLL",
    "PRESS",
    "STOP",
    "parse_rate",
    "episode_success",
    "goal_progress",
    "steps",
    "episodes",
    "step_acc",
    "format",
    "rules",
}


def _stage_events(workdir: Path) -> list[dict]:
    return [json.loads(x) for x in (workdir / "stage_log.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.e2e
def test_results_schema(quick_run):
    config, workdir = quick_run["config"], quick_run["workdir"]
    results = json.loads((workdir / "results.json").read_text())
    rounds = results["rounds"]
    assert [r["round"] for r in rounds][:2] == [0, 1]
    assert len(rounds) == 1 + config.ipl.rounds
    for r in rounds:
        assert set(r["metrics"]) == set(config.data.test_splits)
        for split, table in r["metrics"].items():
            assert SCORE_KEYS <= set(table), (split, sorted(table))
            # the table counts every step of the split, and accuracies are fractions
            assert (
                table["steps"]
                == sum(t["count"] for k, t in table.items() if k in ("CLICK", "TYPE", "SCROLL", "PRESS", "STOP"))
                > 0
            )
            assert 0.0 <= table["step_acc"] <= 1.0
        assert set(r["trees"]) == {"alpha", "beta", "gamma"}
        assert sum(r["trees"].values()) == pytest.approx(1.0)
        assert isinstance(r["pairs"], int) and r["pairs"] >= 0
        assert r["seconds"] > 0
    assert rounds[0]["pairs"] == 0
    # round 1 trained on pairs from its trees: a tree batch with no pair at all would mean nothing was learnt
    assert rounds[1]["pairs"] > 0
    # every round, the starting policy's included, was also played in the live world (eval.online_episodes)
    # on every split of eval.online_splits (seen and unseen tasks); `online` is the first
    for r in rounds:
        assert list(r["online_splits"]) == list(config.eval.online_splits)
        assert r["online"] == r["online_splits"][config.eval.online_splits[0]]
        for split, on in r["online_splits"].items():
            assert on["split"] == split and on["episodes"] == config.eval.online_episodes
            assert 0.0 <= on["success_rate"] <= 1.0 and 1.0 <= on["mean_steps"] <= config.eval.online_max_steps
            assert on["env_steps"] == round(on["mean_steps"] * on["episodes"])
            assert on["success_rate"] + on["wrong_stop_rate"] + on["truncated_rate"] == pytest.approx(1.0)
            tasks = on["tasks"]  # one entry per episode, adding up to the summary
            assert len(tasks) == on["episodes"] and sum(t["steps"] for t in tasks) == on["env_steps"]
            assert sum(t["success"] for t in tasks) == round(on["success_rate"] * on["episodes"])
    assert rounds[1]["samples"] == rounds[1]["budget"] == config.ipl.steps_per_round * 8  # tree leaves
    # round 1 explains itself (ipl.diagnostics): its own and held-out pairs before / after, its steps' figures
    d = rounds[1]["diagnostics"]
    assert "diagnostics" not in rounds[0] and d["train_pairs"]["pairs"] == rounds[1]["pairs"]
    assert 0 < d["heldout_pairs"]["trees"] <= config.ipl.heldout_steps
    assert d["train_steps"]["steps"] == min(config.ipl.diagnostic_steps, config.ipl.steps_per_round)
    shares = {"accuracy_before", "accuracy_after", "reward_accuracy"}
    for section, keys in (("train_pairs", shares), ("heldout_pairs", shares), ("train_steps", set(d["train_steps"]))):
        for k in keys - {"steps"}:
            v = d[section][k]
            assert v is None or 0.0 <= v <= 1.0, (section, k, v)
    assert {f"{k}_{w}" for k in ("pass_at_1", "greedy", "consistency") for w in ("before", "after")} <= set(
        d["train_steps"]
    )
    assert any(line.startswith("train pairs acc") for line in quick_run["lines"])


@pytest.mark.e2e
def test_results_name_the_exported_round_and_carry_reading_scores(quick_run):
    """results.json names the round the job exported (the export stage's), with its scores and the starting policy's,
    and every evaluated policy's reading scores on each test split and with grey screenshots; the run ends saying
    which round it exported."""
    config, workdir = quick_run["config"], quick_run["workdir"]
    results = json.loads((workdir / "results.json").read_text())
    rounds, exported = results["rounds"], results["exported"]
    chosen = json.loads((workdir / "stages" / "export.done").read_text())["exported_round"]
    assert exported["round"] == chosen == max(rounds, key=lambda r: (r["dev"]["step_accuracy"], r["round"]))["round"]
    assert exported["dev"]["step_accuracy"] == [[r["round"], r["dev"]["step_accuracy"]] for r in rounds]
    assert exported["dev"]["episodes"] == config.data.dev_episodes
    # both rounds of the quick job were evaluated when they ran: the export reuses their scores
    assert exported["evaluated_at_export"] is False
    assert "evaluation" not in json.loads((workdir / "stages" / "eval_export.done").read_text())
    for key, entry in (("scores", rounds[chosen]), ("start_scores", rounds[0])):
        s = exported[key]
        assert s["step_accuracy"] == {k: entry["metrics"][k]["step_acc"] for k in config.data.test_splits}
        assert s["step_accuracy_mean"] == pytest.approx(np.mean(list(s["step_accuracy"].values())))
        assert s["online_success"] == {k: v["success_rate"] for k, v in entry["online_splits"].items()}
        assert s["reading"] == entry["reading"]
    for r in rounds:
        assert set(r["reading"]) == set(config.data.test_splits)
        assert set(r["blank_reading"]) == set(config.eval.blank_splits)
        for split, scores in [*r["reading"].items(), *r["blank_reading"].items()]:
            steps = r["metrics"][split]["steps"]
            # every synthetic step knows its page; texts apply to every screen, grounding to clicks on elements
            assert scores["steps"] == scores["page_steps"] == scores["texts_steps"] == steps
            assert 0 < scores["grounding_steps"] <= r["metrics"][split]["CLICK"]["count"]
            assert all(0.0 <= scores[k] <= 1.0 for k in ("page", "texts", "grounding")), (split, scores)
    lines = quick_run["lines"]
    assert any(
        line.startswith(f"exported: {'the starting policy' if chosen == 0 else f'round {chosen}'} ") for line in lines
    )
    assert any(line.startswith("page named") for line in lines)


@pytest.mark.e2e
def test_an_exported_round_without_test_scores_is_evaluated_at_export(quick_run, tmp_path):
    """A copy of the quick job whose round 1 is made to look like an intermediate round of ``eval.every_round =
    false`` (dev accuracy only), export redone: the export stage evaluates it on the test splits, the grey control
    and the live world -- the scores its own stage had, since greedy decoding is deterministic -- and says so."""
    from ipl_jax.pipeline.export_stage import EVAL_KEYS

    workdir = tmp_path / "job"
    shutil.copytree(quick_run["workdir"], workdir, symlinks=True)
    before = json.loads((workdir / "results.json").read_text())
    if json.loads((workdir / "stages" / "export.done").read_text())["exported_round"] != 1:
        pytest.skip("the quick job exported its starting policy (dev accuracy fell): no round to strip")
    marker = workdir / "stages" / "round_1.done"
    summary = json.loads(marker.read_text())
    marker.write_text(json.dumps({**{k: v for k, v in summary.items() if k not in EVAL_KEYS}, "metrics": {}}))
    for name in ("eval_export.done", "export.done"):
        (workdir / "stages" / name).unlink()
    shutil.rmtree(workdir / "eval" / "round_1")
    lines: list[str] = []
    run_job(quick_run["config"], workdir, echo=lines.append)
    results = json.loads((workdir / "results.json").read_text())
    r1, old = results["rounds"][1], before["rounds"][1]
    assert r1["evaluated_at_export"] is True and "evaluated_at_export" not in results["rounds"][0]

    def untimed(d):
        if isinstance(d, list):
            return [untimed(v) for v in d]
        return {k: untimed(v) for k, v in d.items() if "seconds" not in k} if isinstance(d, dict) else d

    for key in EVAL_KEYS:  # the live world's summaries hold their wall time
        assert untimed(r1[key]) == untimed(old[key]), key
    assert (workdir / "eval" / "round_1" / "test.predictions.jsonl").is_file()
    exported = results["exported"]
    assert exported["round"] == 1 and exported["evaluated_at_export"] is True
    assert exported["scores"] == before["exported"]["scores"]
    assert any("not evaluated on the test splits yet, evaluating it now" in line for line in lines)
    assert any("(evaluated for the export)" in line for line in lines)


@pytest.mark.e2e
def test_round_probe_of_unchanged_weights_reads_no_change(quick_run):
    """The probe samples the round's steps before and after the update with the same seed (paired draws): given
    the same weights twice -- an update that changed nothing -- every figure of its steps reads the same."""
    from ipl_jax.pipeline.data_stage import load_splits, steps_of
    from ipl_jax.pipeline.model_stage import load_policy
    from ipl_jax.pipeline.round_diagnostics import RoundDiagnostics
    from ipl_jax.pipeline.workdir import Workdir

    settings, wd = quick_run["config"], Workdir(quick_run["workdir"], echo=lambda *_: None)
    splits = load_splits(settings.data, wd, settings.seed)
    policy = load_policy(quick_run["workdir"] / "start")
    sconfig = settings.sampler.build(policy.tokenizer.ids, settings.buckets, settings.eval.batch_size)
    probe = RoundDiagnostics(settings, policy, steps_of(splits["train"]), steps_of(splits["dev"]), sconfig, 1)
    context = probe.before(policy.params)
    figures = probe.after(policy.params, context)["train_steps"]
    assert figures["steps"] == settings.ipl.diagnostic_steps
    for name in ("pass_at_1", "consistency", "greedy"):
        assert figures[f"{name}_before"] == figures[f"{name}_after"] is not None, name


def test_scores_agree_with_the_predictions_file(quick_run):
    """results.json's tables are the `ipl-jax score` tables of the written predictions (re-scored here)."""
    from ipl_jax.coat.tables import score_episodes
    from ipl_jax.data.datasets import load_dataset
    from ipl_jax.eval.predictions import load_predictions

    workdir = quick_run["workdir"]
    results = json.loads((workdir / "results.json").read_text())
    split = "test_app_unseen"
    preds_file = workdir / "eval" / "round_1" / f"{split}.predictions.jsonl"
    lines = [json.loads(x) for x in preds_file.read_text().splitlines()]
    as_predictions = workdir / "rescore.jsonl"
    as_predictions.write_text(
        "".join(
            json.dumps({"episode_id": r["episode_id"], "step_id": r["step_id"], "prediction": r["prediction"]}) + "\n"
            for r in lines
        )
    )
    episodes = load_dataset(workdir / "data", "aitz", split)
    table = score_episodes(episodes, load_predictions(as_predictions), "aitz")
    assert table["step_acc"] == results["rounds"][1]["metrics"][split]["step_acc"]
    assert table["total"] == results["rounds"][1]["metrics"][split]["total"]


@pytest.mark.e2e
def test_outputs(quick_run):
    from PIL import Image

    from ipl_jax.data.tokenizer import load_tokenizer
    from ipl_jax.model.weights import load_params

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
    # transformers' generate stops at the ids our decoder stops at (<|im_end|> and <|endoftext|>)
    assert json.loads((export / "generation_config.json").read_text())["eos_token_id"] == list(tok.ids.eos)
    assert len(tok.ids.eos) == 2
    assert cfg.text.vocab_size >= len(tok)
    # the exported weights are the chosen round's policy, bit for bit
    chosen = json.loads((workdir / "stages" / "export.done").read_text())["exported_round"]
    src = workdir / ("start" if chosen == 0 else f"rounds/{chosen}/policy")
    other, _ = load_params(str(src))
    import jax

    jax.tree.map(np.testing.assert_array_equal, params, other)
    sft_lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    sft = [x for x in sft_lines if x.get("stage") == "sft"]
    assert [x["step"] for x in sft] == list(range(1, quick_run["config"].sft.steps + 1))
    assert all(np.isfinite(x["loss"]) and x["tokens_per_s"] > 0 for x in sft)


def _key_paths(value, path=()) -> set[tuple]:
    """Every key path of a JSON document, a list's items under one '[]' step."""
    if isinstance(value, dict):
        return {path} | {p for k, v in value.items() for p in _key_paths(v, (*path, k))}
    if isinstance(value, list):
        return {path} | {p for v in value for p in _key_paths(v, (*path, "[]"))}
    return {path}


@pytest.mark.e2e
def test_the_quick_job_on_a_fresh_qwen3vl_model(quick_run, tmp_path):
    """``--config.model.family=qwen3_vl``: a fresh Qwen3-VL-architecture policy (q/k norms, interleaved M-RoPE,
    16-pixel patches, DeepStack) runs every stage; its results.json has the Qwen2-VL run's keys, and its export
    reads as Qwen3-VL with the family's processor."""
    workdir = tmp_path / "qwen3vl"
    flags = ["--config", "synthetic:quick", "--config.model.family=qwen3_vl", "--workdir", str(workdir)]
    run_cli(["run", *flags], quick_run["cache"])
    assert sorted(p.stem for p in (workdir / "stages").glob("*.done")) == sorted(
        {"rounds": "round_1"}.get(s, s) for s in STAGES
    )
    config = json.loads((workdir / "export" / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl" and config["vision_config"]["deepstack_visual_indexes"] == [0]
    processor = json.loads((workdir / "export" / "preprocessor_config.json").read_text())
    assert (processor["patch_size"], processor["image_mean"]) == (16, [0.5] * 3)
    ours, qwen2 = (json.loads((w / "results.json").read_text()) for w in (workdir, quick_run["workdir"]))
    assert _key_paths(ours) == _key_paths(qwen2)
    assert ours["rounds"][1]["pairs"] > 0


@pytest.mark.e2e
def test_tensorboard_events_hold_the_jobs_metrics(quick_run):
    """tensorboard/ read back with TensorBoard's own event reader: the SFT scalars are metrics.jsonl's, step by
    step; the per-round scalars are results.json's, round by round; the step-accuracy plot is the PNG file."""
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, EventAccumulator

    workdir = quick_run["workdir"]

    def run(name: str) -> EventAccumulator:
        return EventAccumulator(str(workdir / "tensorboard" / name), size_guidance={SCALARS: 0, IMAGES: 0}).Reload()

    sft_records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    sft_records = [x for x in sft_records if x.get("stage") == "sft"]
    sft = run("sft")
    for tag, key in (("sft/loss", "loss"), ("sft/learning_rate", "lr"), ("sft/tokens_per_s", "tokens_per_s")):
        events = sft.Scalars(tag)
        assert [e.step for e in events] == [x["step"] for x in sft_records], tag
        np.testing.assert_array_equal([e.value for e in events], np.float32([x[key] for x in sft_records]), tag)

    rounds = json.loads((workdir / "results.json").read_text())["rounds"]
    ipl = run("ipl")
    tags = set(ipl.Tags()["scalars"])
    turn_names = ("trajectory", "turn1", "turn2", "turn3", "turn4")
    for r in rounds:
        want = {f"trees/{k}": r["trees"][k] for k in ("alpha", "beta", "gamma")}
        want["pairs/total"] = r["pairs"]
        want["dev/step_accuracy"] = r["dev"]["step_accuracy"]
        want["online/success_rate"] = r["online"]["success_rate"]
        for split, table in r["metrics"].items():
            for row in ("CLICK", "TYPE", "SCROLL", "PRESS", "STOP", "total"):
                if table[row]["exact_acc"] is not None:
                    want[f"step_accuracy/{split}/{row}"] = table[row]["exact_acc"]
                else:  # a split without steps of this type has no accuracy, so no point at this round
                    tag = f"step_accuracy/{split}/{row}"
                    assert tag not in tags or r["round"] not in [e.step for e in ipl.Scalars(tag)]
        if r["round"] > 0:
            want.update({f"train/{k}": r["train"][k] for k in ("loss", "pref_loss", "reward_margin")})
            want.update({f"pairs/by_turn/{n}": c for n, c in zip(turn_names, r["pairs_by_turn"], strict=True)})
            want.update({f"pairs/by_class/{k}": c for k, c in r["pair_counts"]["by_class"].items()})
        assert set(want) <= tags, sorted(set(want) - tags)
        for tag, value in want.items():
            got = [e.value for e in ipl.Scalars(tag) if e.step == r["round"]]
            assert got == [np.float32(value)], (r["round"], tag, got, value)
    assert [e.step for e in ipl.Scalars("trees/alpha")] == [r["round"] for r in rounds]
    assert not [e for e in ipl.Scalars("train/loss") if e.step == 0]  # the starting policy trained on no pairs
    (image,) = ipl.Images("step_accuracy")
    assert image.step == rounds[-1]["round"]
    assert image.encoded_image_string == (workdir / "step_accuracy.png").read_bytes()


@pytest.mark.e2e
def test_tree_viewer_in_headless_chromium(quick_run, tmp_path):
    """trees.html in a real browser: one rendered section per sampled tree of the last round, each with its
    screenshot decoded at the size of the PNG it embeds and one list item per tree node, and no console error or
    uncaught exception. The page's screenshot is saved as ``trees_html.png`` in this test's tmp directory."""
    import base64
    import io
    import re

    from PIL import Image
    from support.chromium import Chromium, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("no chromium on PATH (tools/test.sh installs Debian's chromium with apt-get when run as root)")
    workdir = quick_run["workdir"]
    last = json.loads((workdir / "results.json").read_text())["rounds"][-1]["round"]
    records = [json.loads(x) for x in (workdir / "rounds" / str(last) / "trees.jsonl").read_text().splitlines()]
    page = workdir / "trees.html"
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', page.read_text())
    sizes = [Image.open(io.BytesIO(base64.b64decode(u))).size for u in uris]

    def n_nodes(node: dict) -> int:
        return sum(1 + n_nodes(c) for c in node.get("children", []))

    with Chromium(binary, tmp_path / "profile") as browser:
        browser.open(page)
        sections = browser.evaluate(
            """(async () => {
              await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
              return [...document.querySelectorAll('section')].map(s => {
                const img = s.querySelector('img'), box = s.getBoundingClientRect();
                return {image: img && [img.complete, img.naturalWidth, img.naturalHeight,
                                       img.getBoundingClientRect().width],
                        nodes: s.querySelectorAll('li').length, height: box.height};
              });
            })()"""
        )
        shot = browser.screenshot(tmp_path / "trees_html.png")
        errors = browser.errors()
    print(f"screenshot of trees.html: {shot}")
    assert errors == []
    assert len(sections) == len(records) == len(sizes) > 0
    for section, record, (width, height) in zip(sections, records, sizes):
        complete, natural_w, natural_h, shown_w = section["image"]
        assert complete and (natural_w, natural_h) == (width, height) and natural_w > 0 and shown_w > 0
        assert section["nodes"] == n_nodes(record) > 0 and section["height"] > 0
    with Image.open(shot) as im:
        assert im.format == "PNG" and im.width >= 1000
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20)) > 50  # text, node colours and screenshots


def doc_snippet(page: str, heading: str) -> str:
    """The first ```python block under ``heading`` in the documentation page ``page`` (a path in the repository)."""
    text = (REPO / page).read_text()
    section = text[text.index(heading + "\n") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


@pytest.mark.e2e
def test_export_snippet_decodes_the_export_like_our_greedy_decoder(quick_run, tmp_path):
    """The transformers snippet of docs/export.md, run on an export for a few test steps, prints the turn-1 text of
    our greedy decoder (``ipl-jax eval``). The export is the quick job's with its weights replaced by random ones of a
    large scale: the 8-step SFT policy answers every step with one repeated token, so it could not tell a wrong
    prompt, lost image positions or a wrong stop from a right one; these weights give a text that changes with
    each of them."""
    import jax

    from ipl_jax.data.datasets import load_dataset
    from ipl_jax.data.dialogue import DEFAULT_PROMPTS
    from ipl_jax.data.tokenizer import SPECIAL_TOKENS
    from ipl_jax.model.params import init_params
    from ipl_jax.model.weights import load_params, save_params

    workdir, config = quick_run["workdir"], quick_run["config"]
    budget = int(config.buckets.max_turn_tokens[0])
    snippet = doc_snippet("docs/export.md", "# Using the export")
    # the snippet's prompt and budget are the job's, and it runs on our files instead of its placeholders
    assert f'describe = "{DEFAULT_PROMPTS.describe}"' in snippet
    assert f"max_new_tokens={budget}," in snippet
    for placeholder in ('"runs/default/export"', '"screen.png"'):
        assert snippet.count(placeholder) == 1, placeholder
    snippet = snippet.replace('"runs/default/export"', "EXPORT").replace('"screen.png"', "SCREEN")
    code = compile(snippet.replace("print(description)", ""), "docs/export.md: Using the export", "exec")

    export = tmp_path / "export"
    shutil.copytree(workdir / "export", export)
    _, cfg = load_params(str(export))
    save_params(init_params(cfg, jax.random.PRNGKey(0), std=0.5), cfg, str(export))
    split, n = config.data.test_splits[0], 4
    preds = tmp_path / "ours.jsonl"
    args = ["eval", "--model", str(export), "--data", str(workdir / "data"), "--format", "aitz", "--split", split]
    args += ["--steps", str(n), "--max-turn-tokens", str(budget), "1", "1", "1", "--predictions", str(preds)]
    run_cli(args, quick_run["cache"])
    ours = [json.loads(x) for x in preds.read_text().splitlines()]
    steps = {(s.episode_id, s.step_id): s for ep in load_dataset(workdir / "data", "aitz", split) for s in ep.steps}
    assert len(ours) == n and len({r["turns"][0] for r in ours}) > 1
    for record in ours:
        screen = tmp_path / f"{record['episode_id']}_{record['step_id']}.png"
        steps[(record["episode_id"], record["step_id"])].load_image().save(screen)
        scope = {"EXPORT": str(export), "SCREEN": str(screen)}
        exec(code, scope)
        assert "mm_token_type_ids" in scope["inputs"]
        # the snippet decodes without special tokens; our turn texts keep them (a random policy emits some)
        want = record["turns"][0]
        for token in SPECIAL_TOKENS:
            want = want.replace(token, "")
        assert scope["description"] == want.strip()


@pytest.mark.e2e
def test_resume_skips_finished_stages(quick_run):
    config, workdir = quick_run["config"], quick_run["workdir"]
    events = _stage_events(workdir)
    started = [e["stage"] for e in events if e["event"] == "started"]
    # every stage ran exactly once over the two invocations (`ipl-jax run` resumed after `ipl-jax sft`)
    expected = [s for s in STAGES if s != "rounds"]
    expected.insert(expected.index("eval_export"), "round_1")
    assert started == expected
    skipped = [e["stage"] for e in events if e["event"] == "skipped"]
    assert skipped == ["data", "evolution", "model", "buckets", "sft"]
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
    # the second invocation printed the per-round tables
    assert any("total match" in line for line in quick_run["lines"])


@pytest.mark.e2e
def test_a_workdir_made_before_the_rename_resumes(quick_run, tmp_path):
    """A copy of the quick job with the former names (``stages/seed.done``, ``stages/eval_seed.done``, ``seed/``,
    the stage log's and config.json's): the job resumes there redoing nothing but the export (removed here, so that
    it copies the exported policy and writes results.json again), and writes today's names only."""
    from support.former_layout import to_former_layout

    workdir = tmp_path / "job"
    shutil.copytree(quick_run["workdir"], workdir, symlinks=True)
    before = json.loads((workdir / "results.json").read_text())
    report_before = json.loads((workdir / "job_report.json").read_text())
    to_former_layout(workdir)
    for name in ("results.json", "stages/export.done"):
        (workdir / name).unlink()
    shutil.rmtree(workdir / "export")
    n_events = len(_stage_events(workdir))
    lines: list[str] = []
    run_job(quick_run["config"], workdir, echo=lines.append)
    new = _stage_events(workdir)[n_events:]
    assert [e["stage"] for e in new if e["event"] == "started"] == ["export"]
    skipped = [e["stage"] for e in new if e["event"] == "skipped"]
    assert skipped[5:7] == ["start", "eval_start"]
    assert "[start] already done (marker stages/seed.done); skipping" in lines
    assert json.loads((workdir / "results.json").read_text()) == before
    assert not (workdir / "start").exists() and not (workdir / "stages" / "start.done").exists()
    exported = before["exported"]["round"]
    src = workdir / ("seed" if exported == 0 else f"rounds/{exported}/policy")
    assert (workdir / "export" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    stages = [s["stage"] for s in json.loads((workdir / "job_report.json").read_text())["stages"]]
    assert stages == [s["stage"] for s in report_before["stages"]]  # the old log's stages under today's names
    assert "\nexported: " in "\n".join(lines)


@pytest.mark.e2e
def test_a_different_config_is_refused(quick_run):
    config = load_settings("synthetic:quick", ["--config.sft.steps=9"])
    with pytest.raises(UsageError, match="different config"):
        run_job(config, quick_run["workdir"], echo=lambda _: None)


@pytest.mark.e2e
def test_select_start_command(quick_run):
    workdir = quick_run["workdir"]
    candidates = sorted(str(p) for p in (workdir / "sft" / "candidates").iterdir())
    assert len(candidates) == 2
    out_json = workdir / "select.json"
    proc = run_cli(
        [
            "select-start",
            "--models",
            *candidates,
            "--data",
            str(workdir / "data"),
            "--steps",
            "4",
            "--config",
            "synthetic:quick",
            "--json",
            str(out_json),
        ],
        quick_run["cache"],
    )
    assert "Acc_S" in proc.stdout and "<- start" in proc.stdout
    got = json.loads(out_json.read_text())
    # the command reproduces the pipeline's own choice of the starting policy (same steps, keys and embedder)
    stage = json.loads((workdir / "stages" / "start.done").read_text())
    assert [c["acc_s"] for c in got["candidates"]] == [c["acc_s"] for c in stage["candidates"]]
    assert [c["div_r"] for c in got["candidates"]] == pytest.approx([c["div_r"] for c in stage["candidates"]])
    assert Path(got["start"]).name == stage["chosen"]


@pytest.mark.e2e
def test_continued_sft_control_spends_the_tdpo_rounds_updates(quick_run, tmp_path):
    """The ``continued_sft`` ablation variant on the quick config, from the quick job as its shared base: it samples
    the same trees as the job's own T-DPO round 1 (same seed and keys), so it packs the same batches, and spends
    exactly that many supervised updates on the golden CoaT; the summary reports its gain with an interval."""
    import shutil

    from ipl_jax.pipeline.ablate import format_ablation, run_ablation

    root = tmp_path / "ablate"
    shutil.copytree(quick_run["workdir"], root / "base", symlinks=True)
    # the candidates' paths in the SFT marker point at the job's own directory, which still exists
    result = run_ablation(quick_run["config"], root, ["continued_sft", "tdpo"], echo=lambda _: None)
    job_round = json.loads((quick_run["workdir"] / "rounds" / "1" / "round.json").read_text())
    row, tdpo = result["rows"][1], result["rows"][2]
    assert row["variant"] == "continued_sft" and row["updates"] == job_round["train"]["steps"] > 0
    assert row["pairs"] == job_round["pairs"]  # the same trees and pairs: only the update differs
    g = row["gain"]
    assert g["low"] <= g["gain"] <= g["high"] and set(row["metrics"]) == set(quick_run["config"].data.test_splits)
    assert row["blank"] and "test" in row["blank"]
    # a gain per round, the last one the row's; T-DPO minus the control paired on the same episodes is the
    # difference of their gains over the same starting policy
    rounds = quick_run["config"].ablation.rounds
    assert len(row["round_gains"]) == len(tdpo["round_gains"]) == rounds and row["round_gains"][-1] == g
    d = row["tdpo_minus"][-1]
    assert d["gain"] == pytest.approx(tdpo["gain"]["gain"] - g["gain"]) and d["low"] <= d["gain"] <= d["high"]
    assert "tdpo_minus" not in tdpo
    text = format_ablation(result)
    assert "continued SFT (control)" in text and "gain [95% CI]" in text and "T-DPO minus r1" in text


# ------------------------------------------------------------------------------------- pieces (no job needed)


def test_world_is_a_typed_config_section():
    from ipl_jax.envs.synthetic.config import WorldConfig
    from ipl_jax.settings import Settings, SettingsError

    # the default config's world section is a valid WorldConfig
    world = load_settings("synthetic").world
    assert world.shuffle_layout is False and world.n_contacts == (4, 8) and world.themes == WorldConfig().themes
    # fields are overridden like any other config field, with their types
    w = load_settings(
        "synthetic",
        [
            "--config.world.width=252",
            "--config.world.n_contacts=(3, 20)",
            "--config.world.themes=('rose',)",
            "--config.world.shuffle_layout=true",
        ],
    ).world
    assert (w.width, w.n_contacts, w.themes, w.shuffle_layout) == (252, (3, 20), ("rose",), True)
    with pytest.raises(SettingsError, match=r"^config\.world: WorldConfig\.themes: unknown theme 'pink'"):
        load_settings("synthetic", ["--config.world.themes=('pink',)"])
    values = load_settings("synthetic").to_dict()
    values["world"]["n_contacts"] = (1, 2, 3)
    with pytest.raises(SettingsError, match=r"^config\.world\.n_contacts=\(1, 2, 3\): must be 2 values"):
        Settings.from_dict(values)


def test_ablation_variants_are_config_switches():
    from ipl_jax.pipeline.ablate import _ipl_key, variant_settings

    base = load_settings("synthetic")
    k2 = variant_settings(base, "k2")
    assert k2.sampler.tree.branching == (2, 2, 2, 1)
    assert k2.ipl.rounds == base.ablation.rounds and k2.ipl.early_stop is False
    assert variant_settings(base, "no_negatives").ipl.method == "no_negatives"
    assert variant_settings(base, "naive_dpo").ipl.method == "naive_dpo"
    assert variant_settings(base, "no_evolution").evolution.enabled is False
    # with the default branching (3, 3, 3, 1), K = 3 is the full method: one run serves both rows
    assert _ipl_key(variant_settings(base, "k3")) == _ipl_key(variant_settings(base, "tdpo"))
    assert _ipl_key(variant_settings(base, "k4")) != _ipl_key(variant_settings(base, "tdpo"))
    assert variant_settings(base, "grpo").ipl.method == "grpo"
    with pytest.raises(ValueError, match="unknown ablation variant"):
        variant_settings(base, "sarsa")


@pytest.mark.slow
def test_ablate_quick(tmp_path_factory):
    """`ipl-jax ablate` on the quick config: a shared starting policy, two IPL variants and an alias (k2 = the quick
    config's own branching, i.e. the tdpo run)."""
    cache = tmp_path_factory.getbasetemp() / "jax_compilation_cache"
    root = tmp_path_factory.mktemp("ablate")
    proc = run_cli(
        ["ablate", "--config", "synthetic:quick", "--workdir", str(root), "--variants", "tdpo,no_negatives,k2"], cache
    )
    result = json.loads((root / "ablation.json").read_text())
    assert [r["variant"] for r in result["rows"]] == ["start", "tdpo", "no_negatives", "k2"]
    assert result["rows"][3]["same_as"] == "tdpo"
    for r in result["rows"][1:3]:
        assert set(r["metrics"]) == set(load_settings("synthetic:quick").data.test_splits)
        assert r["pairs"] > 0
    # the variants started from the base job's starting policy: their round-1 input policy is it
    assert (root / "variants" / "tdpo" / "start").resolve() == (root / "base" / "start").resolve()
    # ... while each variant's own rounds are evaluated into its own directory (not one shared with the others)
    preds = {v: root / "variants" / v / "eval" / "round_1" / "test.predictions.jsonl" for v in ("tdpo", "no_negatives")}
    assert all(p.is_file() for p in preds.values())
    assert preds["tdpo"].resolve() != preds["no_negatives"].resolve()
    assert not (root / "base" / "eval" / "round_1").exists()
    assert "T-DPO (full)" in proc.stdout and "IPL w/o negatives" in proc.stdout


@pytest.mark.e2e
def test_eval_online_replays_the_jobs_online_evaluation(quick_run, tmp_path):
    """`ipl-jax eval --online` on the exported policy gives the job's own online numbers for that round."""
    workdir = quick_run["workdir"]
    chosen = json.loads((workdir / "stages" / "export.done").read_text())["exported_round"]
    want = json.loads((workdir / "results.json").read_text())["rounds"][chosen]["online"]
    out = tmp_path / "online.json"
    args = ["eval", "--online", "--model", str(workdir / "export"), "--config", "synthetic:quick", "--json", str(out)]
    proc = run_cli(args, quick_run["cache"])
    got = json.loads(out.read_text())
    assert got["seed"] == quick_run["config"].seed and got["split"] == want["split"]
    for k in ("episodes", "success_rate", "mean_steps", "env_steps", "truncated_rate", "by_family"):
        assert got[k] == want[k], k
    untimed = lambda tasks: [{k: v for k, v in t.items() if k != "wall_seconds"} for t in tasks]
    assert untimed(got["tasks"]) == untimed(want["tasks"])  # the same episodes, task by task
    assert f"success rate {100 * want['success_rate']:.1f}%" in proc.stdout


def _rl_rows(result: dict, config) -> dict:
    """Checks every RL row shares: the starting policy's numbers, the stated budget rule, online success in [0, 1]."""
    from ipl_jax.pipeline.rl_round import grpo_prompts

    rows = {r["variant"]: r for r in result["rows"]}
    assert result["seed"] == config.seed and rows["start"]["samples"] == 0
    for name, r in rows.items():
        assert 0.0 <= r["online"]["success_rate"] <= 1.0 and r["online"]["episodes"] == config.eval.online_episodes
        assert set(r["metrics"]) == set(config.data.test_splits)
        if name == "start":
            continue
        vc = variant_settings(config, name, {name: EXTRA.get(name, {"ipl.method": name})})
        b = r["budget"]
        assert b == vc.ipl.steps_per_round * 8 and r["method"] == vc.ipl.method
        if vc.ipl.method == "grpo":  # floor(budget / G) prompts x G completions
            assert r["samples"] == grpo_prompts(b, vc.rl.grpo.group_size) * vc.rl.grpo.group_size <= b
        elif vc.ipl.method in ("ppo", "gigppo"):  # rollout batches until the budget, the last one cut there
            assert r["samples"] == b
        else:
            assert r["samples"] == b
        if vc.ipl.method in ("grpo", "ppo", "gigppo"):
            assert r["pairs"] == 0 and r["updates"] >= 1
    return rows


# the smallest RL rounds: 8 completions / environment steps (one training step's 8 leaves)
EXTRA = {
    "grpo_tiny": {
        "ipl.method": "grpo",
        "ipl.steps_per_round": 1,
        "rl.grpo.group_size": 4,
        "rl.grpo.prompts_per_batch": 2,
    },
    "gigppo_tiny": {
        "ipl.method": "gigppo",
        "ipl.steps_per_round": 1,
        "rl.ppo.max_steps": 2,
        "rl.ppo.critic_warmup": 0,
    },
}


@pytest.mark.e2e
def test_rl_rounds_in_the_ablation(quick_run, tmp_path):
    """The RL methods as rounds of the job's one loop, from the quick job as the shared base, at the smallest
    budget: the round records, the ablation rows (samples = the budget rule, online success) and the table."""
    import shutil

    from ipl_jax.pipeline.ablate import format_ablation, run_ablation

    config = quick_run["config"]
    root = tmp_path / "ablate"
    shutil.copytree(quick_run["workdir"], root / "base", symlinks=True)
    result = run_ablation(config, root, list(EXTRA), echo=lambda _: None, extra_variants=EXTRA)
    rows = _rl_rows(result, config)
    start_online = json.loads((quick_run["workdir"] / "results.json").read_text())["rounds"][0]["online"]
    assert rows["start"]["online"] == start_online
    record = json.loads((root / "variants" / "gigppo_tiny" / "rounds" / "1" / "round.json").read_text())
    assert record["method"] == "gigppo" and record["train"]["critic_updates"] >= 1
    assert record["train"]["train_episodes"]["env_steps"] == record["samples"]
    text = format_ablation(result)
    assert "online %" in text and "grpo_tiny" in text


@pytest.mark.slow
def test_ablate_rl_variants_quick(quick_run, tmp_path):
    """`ipl-jax ablate --config synthetic:quick --variants tdpo,grpo,ppo,gigppo` on the quick job as the base."""
    import shutil

    config = quick_run["config"]
    root = tmp_path / "ablate"
    shutil.copytree(quick_run["workdir"], root / "base", symlinks=True)
    args = ["ablate", "--config", "synthetic:quick", "--workdir", str(root), "--variants", "tdpo,grpo,ppo,gigppo"]
    proc = run_cli(args, quick_run["cache"])
    result = json.loads((root / "ablation.json").read_text())
    assert [r["variant"] for r in result["rows"]] == ["start", "tdpo", "grpo", "ppo", "gigppo"]
    _rl_rows(result, config)
    for v in ("tdpo", "grpo", "ppo", "gigppo"):  # one starting policy: every variant's round 1 starts from the base's
        assert (root / "variants" / v / "start").resolve() == (root / "base" / "start").resolve()
    assert "GRPO (UI-R1)" in proc.stdout and "GiGPPO (online)" in proc.stdout and "online %" in proc.stdout
