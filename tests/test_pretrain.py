"""The base model's pretraining: its screens come from the training split's world only, its chats say what the
renderer knows, its reading scores are right on hand-made answers, and the quick recipe runs end to end."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipl_jax.coat.actions import parse_grounding
from ipl_jax.envs.synthetic.config import HELD_OUT_THEMES, HELD_OUT_VARIANTS, SEEN_VARIANTS, WorldConfig
from ipl_jax.envs.synthetic.content import SUBMENU_OF
from ipl_jax.envs.synthetic.dataset import SPLITS, episode_seed, generate_split
from ipl_jax.envs.synthetic.reading import (
    PRETRAIN_SPLIT,
    TEXTS_PROMPT,
    ReadingChat,
    pretrain_episodes,
    reading_messages,
    reading_qa,
    screen_texts,
    task_answers,
)
from ipl_jax.envs.synthetic.tasks import Task
from ipl_jax.eval.reading import box_hit, chat_answer_score


def ipl_jax(*args) -> None:
    """The command in a process of its own (a whole job: its compiled programs and threads end with it)."""
    done = subprocess.run([sys.executable, "-m", "ipl_jax.cli", *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def episodes():
    return pretrain_episodes(40, seed=0)


def test_pretraining_screens_never_come_from_a_test_split_or_an_unseen_app(episodes):
    world = WorldConfig()
    for ep in episodes:
        assert ep.meta["split"] == PRETRAIN_SPLIT
        assert ep.meta["theme"] in world.themes and ep.meta["theme"] not in HELD_OUT_THEMES
        assert ep.meta["variant"] in SEEN_VARIANTS and ep.meta["variant"] not in HELD_OUT_VARIANTS
        assert not Task.from_json(ep.meta["task"]).unseen
    # no world seed of an evaluation split (dev and the three test splits) of job seeds 0-9 is drawn
    drawn = {ep.meta["world_seed"] for ep in pretrain_episodes(200, seed=0)}
    for seed in range(10):
        for split in SPLITS:
            if split != "train":
                assert not drawn & {episode_seed(seed, split, i) for i in range(200)}, (seed, split)


def test_a_reading_chat_says_what_the_renderer_knows(episodes):
    step = episodes[0].steps[0]
    messages = reading_messages(step, seed=0, chat=ReadingChat(where=2, what=2))
    assert [m["role"] for m in messages] == ["user", "assistant"] * 6
    assert messages[0]["content"][0] == {"type": "image"}
    assert messages[1]["content"] == step.coat.screen_desc  # turn 1 of the CoaT, the same prompt
    assert messages[2]["content"] == TEXTS_PROMPT
    texts = [e.text for e in screen_texts(step)]
    assert messages[3]["content"] == "; ".join(texts)
    for q, a in zip(messages[4:8:2], messages[5:9:2]):
        name = q["content"].split('"')[1]
        (el,) = [e for e in step.elements if e.text == name]
        assert np.allclose(parse_grounding(a["content"]), el.box, atol=1e-3)
    for q, a in zip(messages[8::2], messages[9::2]):
        x, y = (int(v) / 1000 for v in q["content"].split("(")[1].split(")")[0].split(","))
        (el,) = [e for e in step.elements if e.text == a["content"]]
        assert el.box[0] <= x <= el.box[2] and el.box[1] <= y <= el.box[3]
    assert reading_messages(step, 0, ReadingChat(2, 2)) == messages  # a pure function of (seed, episode, step)


def test_the_task_questions_read_the_instruction_against_the_screen(episodes):
    """``names``: the screen text the instruction names (contact, setting, its menu, app, then the app the task
    happens in); ``typed``: the query or message, else "None."."""
    chat = ReadingChat(where=1, what=1, task=True)
    seen = set()
    for ep in episodes:
        task = Task.from_json(ep.meta["task"])
        for step in ep.steps:
            qa = reading_qa(step, 0, chat)
            (k1, q1, named), (k2, q2, typed) = qa[-2:]
            assert (k1, k2) == ("names", "typed") and step.instruction in q1 and step.instruction in q2
            assert typed == (task.query or task.message or "None.")
            shown = [e.text for e in screen_texts(step)]
            if named != "None.":
                assert named in shown
                menus = [SUBMENU_OF.get(task.setting, ""), SUBMENU_OF.get(task.setting2, "")]
                entities = [task.contact, task.setting, task.setting2, *menus, task.app, task.target_app]
                assert named.lower() in {e.lower() for e in entities if e}
            seen.add((task.family, named == "None."))
            if task.family == "send_message" and task.contact in shown:
                assert named == task.contact  # the contact before the app the task happens in
    assert ("send_message", False) in seen and ("toggle", False) in seen and len(seen) >= 6
    # without a task (any step but the pretraining stream's) or with task=False: no task question
    step = episodes[0].steps[0]
    bare = dataclasses.replace(step, meta={k: v for k, v in step.meta.items() if k != "task"})
    assert task_answers(bare) is None and len(reading_qa(bare, 0, chat)) == len(reading_qa(step, 0, chat)) - 2
    assert [k for k, _, _ in reading_qa(step, 0, ReadingChat(1, 1))] == ["describe", "texts", "where", "what"]


def test_reading_chat_answers_are_scored_on_hand_made_answers(episodes):
    step = next(s for e in episodes for s in e.steps if s.meta["app"] == "Settings" and s.meta["page"] == "main")
    assert step.meta["page_name"] == "the Settings list"
    assert chat_answer_score("describe", "The screen shows the Settings list. Top: Wi-Fi off.", "", step) == 1.0
    assert chat_answer_score("describe", "The screen shows the home screen.", "", step) == 0.0
    texts = [e.text for e in screen_texts(step)]
    assert chat_answer_score("texts", "; ".join(texts), "", step) == 1.0
    assert chat_answer_score("texts", "Nothing here.", "", step) == 0.0
    golden = "<|box_start|>(150,100),(250,200)<|box_end|>"
    assert chat_answer_score("where", "(100,100),(300,200)", golden, step) == 1.0  # centre (200, 150) inside
    assert chat_answer_score("where", "(100,100),(190,200)", golden, step) == 0.0  # centre x 0.145: left of it
    assert chat_answer_score("what", " Wi-Fi ", "Wi-Fi", step) == 1.0
    assert chat_answer_score("what", "Wi-Fi off", "Wi-Fi", step) == 0.0
    assert box_hit("(160,110)", (0.15, 0.1, 0.25, 0.2)) and not box_hit("no box", (0.0, 0.0, 1.0, 1.0))


def test_the_quick_recipe_trains_scores_and_writes_a_loadable_base(tmp_path):
    from ipl_jax.pipeline.model_stage import load_policy

    ipl_jax("pretrain", "--config", "pretrain:quick", "--workdir", tmp_path)
    out = tmp_path / "pretrain" / "model"
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["training"]["steps"] == 4 and len(recipe["loss_curve"]) >= 1
    assert set(recipe["reading"]) >= {"describe", "texts", "where", "what", "screens"}
    policy = load_policy(out)
    assert policy.cfg.text.num_hidden_layers == 2
    # a base continued from this one with the task questions: the same tokenizer and shape, its parent's recipe
    # beside its own, and the two task questions scored
    ipl_jax(
        "pretrain",
        "--config",
        "pretrain:quick",
        f"--config.model.checkpoint={out}",
        "--config.pretrain.task=True",
        "--workdir",
        tmp_path / "tasks",
    )
    child = json.loads((tmp_path / "tasks" / "pretrain" / "model" / "recipe.json").read_text())
    assert child["base"] == recipe and child["settings"]["model"]["checkpoint"] == str(out)
    assert recipe["reading"]["names"] is None and recipe["reading"]["typed"] is None  # not asked
    assert child["reading"]["names"] is not None and child["reading"]["typed"] is not None
    # the job's train split draws no pretraining screen
    train = {e.meta["world_seed"] for e in generate_split("train", 20, seed=0, config=WorldConfig())}
    assert not train & {e.meta["world_seed"] for e in pretrain_episodes(6, seed=0)}


def test_the_shipped_base_loads_and_reproduces_its_recorded_reading_scores():
    """ipl_jax/checkpoints/reader (``ipl-jax pretrain --out ipl_jax/checkpoints/reader``): within 50 MB, the
    ``synthetic:reader`` job's starting checkpoint, and its greedy answers on the first held-out episodes score as
    recipe.json says."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.eval.reading import chat_reading_scores
    from ipl_jax.pipeline import pretrain as P
    from ipl_jax.pipeline.model_stage import load_policy

    settings = load_settings("synthetic:reader")
    base = settings.model.checkpoint_dir()
    assert settings.model.checkpoint == "builtin:reader" and (Path(base) / "config.json").is_file()
    assert sum(f.stat().st_size for f in Path(base).iterdir()) <= 50 * 2**20
    recipe = json.loads((Path(base) / "recipe.json").read_text())
    recorded = P.recorded_settings(recipe)
    check = recipe["reading"]["check"]
    steps = P.screens(recorded, recorded.pretrain.episodes, check["episodes"])
    got = chat_reading_scores(load_policy(Path(base)), steps, recorded.seed, P.reading_chat(recorded))
    kinds = [k for k in ("describe", "texts", "where", "what", "names", "typed", "screens") if k in check]
    assert len(kinds) >= 5 and {k: got[k] for k in kinds} == {k: check[k] for k in kinds}


BASE_PATH = [  # the synthetic:reader job's start (configs/synthetic.py read) on the quick job's data and steps
    "--config.model.checkpoint=builtin:reader",
    f"--config.model.min_pixels={224 * 448}",
    f"--config.model.max_pixels={224 * 448}",
    "--config.buckets.patches=(512,)",
    "--config.buckets.tokens=(480,)",
    "--config.sampler.tree.prefix_buckets=(192,)",
    "--config.ipl.text_buckets=(768,)",
]


@pytest.mark.e2e
def test_the_quick_job_runs_from_the_shipped_base_and_reports_its_reading(tmp_path):
    """The job's path from ``builtin:reader``: the model stage copies the base (its tokenizer, its size, full
    resolution), warm-up SFT and a round train on it, and every evaluated policy has reading scores."""
    from ipl_jax.data.tokenizer import load_tokenizer
    from ipl_jax.settings import ModelSettings

    base = Path(ModelSettings(checkpoint="builtin:reader").checkpoint_dir())
    ipl_jax("run", "--config", "synthetic:quick", *BASE_PATH, "--workdir", tmp_path)
    init = tmp_path / "model" / "init"
    assert json.loads((init / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    assert len(load_tokenizer(init)) == len(load_tokenizer(base))
    results = json.loads((tmp_path / "results.json").read_text())
    for entry in results["rounds"]:
        assert entry["reading"]["test"]["page"] is not None and entry["reading"]["test"]["steps"] > 0
    assert results["exported"]["round"] in (0, 1)


def test_warm_up_sft_can_mix_in_the_reading_chats_of_pretraining_screens():
    """``sft.reading_episodes``: reading items from the pretraining stream (never the job's splits), built as the
    pretraining's own examples; refused, in one line, on data other than the synthetic world."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.data.tokenizer import load_tokenizer
    from ipl_jax.envs.synthetic.reading import reading_example
    from ipl_jax.pipeline.sft_stage import make_example_fn, reading_items
    from ipl_jax.sections import SettingsError
    from ipl_jax.settings import ModelSettings

    settings = load_settings("synthetic:quick", ["--config.sft.reading_episodes=2", "--config.pretrain.task=True"])
    items = reading_items(settings)
    expected = [s for e in pretrain_episodes(2, settings.seed, settings.world) for s in e.steps]
    assert [(i.step.episode_id, i.step.step_id) for i in items] == [(s.episode_id, s.step_id) for s in expected]
    assert all(i.reading and i.qa is None and i.step.meta["task"] for i in items)
    assert reading_items(load_settings("synthetic:quick")) == []

    tok = load_tokenizer(Path(ModelSettings(checkpoint="builtin:reader").checkpoint_dir()))
    image = settings.model.image_processor()
    chat = ReadingChat.of(settings.pretrain)
    got = make_example_fn(tok, image, reading=(settings.seed, chat))(items[0])
    want = reading_example(items[0].step, settings.seed, chat, tok, image)
    assert np.array_equal(got.input_ids, want.input_ids) and np.array_equal(got.loss_mask, want.loss_mask)
    assert got.loss_mask.sum() > 0

    other = ["--config.data.format=aitz", "--config.data.root=/nowhere", "--config.eval.online_episodes=0"]
    with pytest.raises(SettingsError, match=r"config.sft.reading_episodes=2: .* 'aitz' \(fix it with"):
        load_settings("synthetic:quick", ["--config.sft.reading_episodes=2", *other])
