"""``ipl-jax pretrain``: a base model that reads the world's screens, trained from scratch on reading chats
(``envs/synthetic/reading.py``) and written as a Hugging Face checkpoint that a job starts from
(``model.checkpoint``). Stages: screens -> tokenizer and fresh model -> training (resumable) -> held-out reading
scores -> ``WORKDIR/pretrain/model`` with ``recipe.json`` beside it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np

from ipl_jax.envs.synthetic.reading import (
    ReadingChat,
    pretrain_screens,
    reading_corpus,
    reading_example,
)
from ipl_jax.eval.reading import chat_reading_scores
from ipl_jax.pipeline import model_stage
from ipl_jax.pipeline.sft_stage import fit_dialogues
from ipl_jax.pipeline.workdir import Workdir, write_json
from ipl_jax.settings import Settings


def reading_chat(settings: Settings) -> ReadingChat:
    return ReadingChat.of(settings.pretrain)


def screens(settings: Settings, start: int, n: int) -> list:
    """The steps (one screen each) of pretraining episodes ``start .. start + n - 1``."""
    return pretrain_screens(n, settings.seed, settings.world, start)


def make_reading_example(settings: Settings):
    """(tokenizer, image config) -> (step -> the ``TrainingExample`` of its reading chat)."""
    chat, seed = reading_chat(settings), settings.seed
    return lambda tok, image_config: lambda step: reading_example(step, seed, chat, tok, image_config)


def recorded_settings(recipe: dict) -> Settings:
    """The settings a recipe.json ran with; fields added since it was written take their defaults."""
    d = Settings.defaults()
    return Settings.from_dict(
        {k: {**d[k], **v} if isinstance(v, dict) else v for k, v in {**d, **recipe["settings"]}.items()}
    )


CHECK_EPISODES = 2  # held-out episodes whose reading scores a test reproduces from the written model


@dataclasses.dataclass
class Pretraining:
    """The pretraining job's stages over one workdir."""

    settings: Settings
    wd: Workdir

    def train_screens(self) -> list:
        return screens(self.settings, 0, self.settings.pretrain.episodes)

    def eval_screens(self) -> list:
        p = self.settings.pretrain
        return screens(self.settings, p.episodes, p.eval_episodes)

    def model(self) -> dict:
        steps = self.train_screens()
        texts = reading_corpus(steps, self.settings.seed, reading_chat(self.settings))
        return model_stage.build_initial_model(self.settings, self.wd, steps, (), texts=texts)

    def pretrain(self) -> dict:
        items = self.train_screens()
        self.wd.echo(f"  pretraining on {len(items)} screens ({self.settings.pretrain.episodes} episodes)")
        return fit_dialogues(self.settings, self.wd, "pretrain", items, make_reading_example(self.settings))

    def reading(self) -> dict:
        """Held-out reading scores of the trained model, and ``check``: those of the first ``CHECK_EPISODES``
        held-out episodes alone, which a test reproduces from the written model in seconds."""
        policy = model_stage.load_policy(self.last_candidate())
        chat, seed = reading_chat(self.settings), self.settings.seed
        steps = self.eval_screens()
        out = chat_reading_scores(policy, steps, seed, chat)
        first = list(dict.fromkeys(s.episode_id for s in steps))[:CHECK_EPISODES]
        check = [s for s in steps if s.episode_id in first]  # scored alone, as the test scores them
        out["check"] = {"episodes": len(first), **chat_reading_scores(policy, check, seed, chat)}
        del out["check"]["examples"]
        return out

    def last_candidate(self) -> Path:
        return Path(sorted((self.wd.path("pretrain", "candidates")).iterdir())[-1])

    def export(self, summary: dict, out: Path) -> dict:
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(self.last_candidate(), out)
        write_json(out / "recipe.json", summary)
        return {"model": str(out), "bytes": sum(f.stat().st_size for f in out.iterdir())}


def loss_curve(wd: Workdir, every: int = 50) -> list[list[float]]:
    """[[step, mean loss of the ``every`` steps up to it], ...] from the workdir's metrics log."""
    path = wd.path("metrics.jsonl")
    if not path.exists():
        return []
    losses = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("stage") == "pretrain" and "loss" in r:
            losses[int(r["step"])] = float(r["loss"])
    steps = sorted(losses)
    return [
        [s, round(float(np.mean([losses[t] for t in steps if s - every < t <= s])), 4)]
        for s in steps
        if s % every == 0 or s == steps[-1]
    ]


def run_pretrain(settings: Settings, workdir: str | Path, out: str | Path | None = None, echo=print) -> dict:
    """Every stage of the pretraining job in ``workdir``; the model goes to ``out`` (default
    ``WORKDIR/pretrain/model``) with ``recipe.json``; returns the recipe. A base may start from another
    (``model.checkpoint``): the settings are resolved here, once, as a job's are."""
    settings = settings.resolved(jax.device_count())
    wd = Workdir(workdir, echo=echo)
    job = Pretraining(settings, wd)
    wd.run_stage("model", job.model)
    fit = wd.run_stage("pretrain", job.pretrain)
    scores = wd.run_stage("reading", job.reading)
    scores.pop("seconds", None)
    recipe = {
        "command": "ipl-jax pretrain",
        "settings": {k: settings.to_dict()[k] for k in ("seed", "world", "model", "buckets", "sft", "pretrain")},
        "training": {k: fit.get(k) for k in ("steps", "items", "final_loss", "mean_loss_last_10", "train_seconds")},
        "loss_curve": loss_curve(wd),
        "reading": scores,
    }
    parent = Path(settings.model.checkpoint_dir()) / "recipe.json" if settings.model.checkpoint else None
    if parent is not None and parent.is_file():  # continued from another base: its recipe goes along
        recipe["base"] = json.loads(parent.read_text())
    out = Path(out) if out else wd.path("pretrain", "model")
    wd.run_stage("export", lambda: job.export(recipe, out), main_only=True)
    return recipe
