"""Online evaluation in a live world (``envs.protocol``: the synthetic world, AndroidWorld): the success rate (the
world's own score; synthetic: ``stop`` at the goal) with its 95% interval, mean steps, per-family rates and one
record per episode (its error, if an environment failed, and its wall time). Greedy by default; with a
temperature, ``samples_per_task`` episodes per task.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from ipl_jax import storage
from ipl_jax.coat.rewards import RewardConfig
from ipl_jax.coat.tree import NUM_TURNS
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.envs.protocol import Env, EnvTask, replicate
from ipl_jax.model.inputs import DEFAULT_PATCH_BUCKETS, DEFAULT_TEXT_BUCKETS
from ipl_jax.rl.rollout import RolloutConfig, rollout, rollout_summary, wilson_interval
from ipl_jax.sampling.config import DEFAULT_PROMPT_BUCKETS, SamplerConfig


@dataclasses.dataclass(frozen=True)
class OnlineEvalConfig:
    """rollout (``RolloutConfig``); temperature (0 = greedy); samples_per_task; keep_episodes (adds
    ``episodes_detail``)."""

    rollout: RolloutConfig
    temperature: float = 0.0
    samples_per_task: int = 1
    keep_episodes: bool = True

    def __post_init__(self):
        if self.samples_per_task < 1:
            raise ValueError(f"OnlineEvalConfig.samples_per_task must be >= 1, got {self.samples_per_task}")
        if self.temperature < 0:
            raise ValueError(f"OnlineEvalConfig.temperature must be >= 0, got {self.temperature}")


def _episode_record(tr) -> dict:
    return {
        "name": tr.task.name,
        "family": tr.task.family,
        "instruction": tr.goal,
        "success": bool(tr.success),
        "score": float(tr.score),
        "stopped": bool(tr.stopped),
        "truncated": bool(tr.truncated),
        "steps": tr.num_steps,
        "step_limit": tr.task.step_limit,
        "actions": [s.texts[2] for s in tr.steps],
        "rewards": [round(float(s.reward), 4) for s in tr.steps],
        "unparsable_steps": int(sum(not s.action.parsed for s in tr.steps)),
        "error": tr.error,
        "wall_seconds": round(float(tr.wall_seconds), 3),
    }


def online_eval(
    params: dict,
    cfg,
    tokenizer,
    world_tasks: Sequence[EnvTask],
    envs: Sequence[Env],
    rng,
    config: OnlineEvalConfig,
    mesh=None,
    on_episode: Callable[[dict], None] | None = None,
) -> dict:
    """Play every task ``samples_per_task`` times on ``envs`` and summarise (``rl.rollout.rollout_summary``:
    success_rate and success_ci95, mean_steps, truncated_rate, wrong_stop_rate, failed_episodes, ...; by_family;
    episodes_detail with ``keep_episodes``). ``on_episode(record)`` gets each episode's record as it ends.
    """
    if not world_tasks:
        raise ValueError("online_eval: no tasks")
    t = float(config.temperature)
    rcfg = dataclasses.replace(
        config.rollout, keep_prompts=False, sampler=config.rollout.sampler.replace(temperature=(t,) * NUM_TURNS)
    )
    tasks = replicate(world_tasks, config.samples_per_task) if config.samples_per_task > 1 else list(world_tasks)
    done = None if on_episode is None else (lambda tr: on_episode(_episode_record(tr)))
    trajs = rollout(params, cfg, tokenizer, tasks, envs, rng, rcfg, mesh, on_done=done)
    out = rollout_summary(trajs)
    fams = defaultdict(list)
    for tr in trajs:
        fams[tr.task.family].append(tr)
    out["by_family"] = {
        f: {
            "episodes": len(v),
            "success_rate": float(np.mean([tr.success for tr in v])),
            "mean_steps": float(np.mean([tr.num_steps for tr in v])),
        }
        for f, v in sorted(fams.items())
    }
    if config.keep_episodes:
        out["episodes_detail"] = [_episode_record(tr) for tr in trajs]
    return out


TASK_FIELDS = ("name", "family", "success", "score", "steps", "step_limit", "wall_seconds", "error")


def summarize_records(records: Sequence[dict]) -> dict:
    """The summary of episode records (``_episode_record``'s, e.g. read back from a resumed run's log): the numbers
    ``online_eval`` gives for the same episodes (none cut by a budget), ``by_family``, and ``tasks``: per episode
    its name, family, success, score, steps, step limit, wall time and error (null unless an environment failed
    it)."""
    n = len(records)
    if n == 0:
        return {"episodes": 0, "success_rate": None, "mean_steps": None, "by_family": {}, "tasks": []}

    def mean(key, rows=records):
        return float(np.mean([r[key] for r in rows]))

    ok = [r["steps"] for r in records if r["success"]]
    ci = wilson_interval(len(ok), n)
    env_steps = int(sum(r["steps"] for r in records))
    rewards = [x for r in records for x in r.get("rewards", [])]
    fams = defaultdict(list)
    for r in records:
        fams[r["family"]].append(r)
    return {
        "episodes": n,
        "success_rate": mean("success"),
        "success_ci95": [round(ci[0], 4), round(ci[1], 4)],
        "mean_score": mean("score"),
        "mean_steps": mean("steps"),
        "mean_steps_success": float(np.mean(ok)) if ok else None,
        "truncated_rate": mean("truncated"),
        "wrong_stop_rate": float(np.mean([r["stopped"] and not r["success"] for r in records])),
        "unparsable_rate": sum(r.get("unparsable_steps", 0) for r in records) / env_steps if env_steps else 0.0,
        "mean_step_reward": float(np.mean(rewards)) if rewards else 0.0,
        "env_steps": env_steps,
        "budget_cut": 0,
        "failed_episodes": int(sum(r["error"] is not None for r in records)),
        "errors": {r["name"]: r["error"] for r in records if r["error"] is not None},
        "mean_wall_seconds": round(mean("wall_seconds"), 3),
        "by_family": {
            f: {"episodes": len(v), "success_rate": mean("success", v), "mean_steps": mean("steps", v)}
            for f, v in sorted(fams.items())
        },
        "tasks": [{k: r.get(k) for k in TASK_FIELDS} for r in records],
    }


class EpisodeLog:
    """An episode-record JSONL file (``ipl-jax eval --online --predictions``) that makes a run resumable: the
    records already there are read (``done``: by name; a line cut short by an interrupted write is dropped, as is
    the record of an episode an environment failed, which is played again), the file is rewritten clean, and each
    new record is appended as its episode ends (locally an append; an object store's object is rewritten).
    ``finish`` writes it whole: this run's episodes in task order, then any other records it held.
    ValueError (one line) for a line that is not an episode record."""

    def __init__(self, path, write: bool = True):
        self.path, self.write = path, write
        self.done: dict[str, dict] = {}
        self.others: list[dict] = []
        self.new: dict[str, dict] = {}
        p = storage.as_path(path)
        lines = p.read_text(encoding="utf-8").splitlines() if p.exists() else []
        for n, line in enumerate(lines, 1):
            try:
                r = json.loads(line)
            except ValueError:
                if n == len(lines):  # the last line, cut short
                    continue
                raise ValueError(f"{path}: line {n} is not JSON") from None
            if not (isinstance(r, dict) and isinstance(r.get("name"), str) and "success" in r):
                raise ValueError(f"{path}: line {n} is not an episode record of ipl-jax eval --online")
            if r.get("error") is None:
                self.done[r["name"]] = r
            else:
                self.others.append(r)
        self.known = self._text(list(self.done.values()) + self.others)
        if self.write and lines:
            storage.write_text(path, self.known)

    @staticmethod
    def _text(records) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

    def append(self, record: dict) -> None:
        self.new[record["name"]] = record
        if self.write:
            self.known = storage.append_text(self.path, self._text([record]), self.known)

    def finish(self, tasks: Sequence[EnvTask]) -> list[dict]:
        """This run's records in task order (each task's newest), the file rewritten with them and the rest."""
        mine = [self.new.get(t.name) or self.done[t.name] for t in tasks]
        names = {t.name for t in tasks}
        rest = [r for r in list(self.done.values()) + self.others if r["name"] not in names]
        if self.write:
            storage.write_text(self.path, self._text(mine + rest))
        return mine


# ------------------------------------------------------------------------------------------------ job wiring


def any_screen_buckets(sampler: SamplerConfig, image_config: ImageProcessorConfig, images: int) -> SamplerConfig:
    """``sampler`` able to take ``images`` screenshots of any size (a world whose screens the job's buckets were not
    fitted to: AndroidWorld's phones): patch buckets up to ``images`` screens at the processor's largest size, and
    the wide text buckets (a screen's image tokens are most of a prompt)."""
    merge = image_config.merge_size**2
    per_image = image_config.max_pixels // image_config.patch_size**2 // merge * merge
    cap = int(images) * per_image
    patches = {b for b in DEFAULT_PATCH_BUCKETS if b < cap} | {cap}
    return sampler.with_patch_buckets(patches).replace(
        image_patches=max(sampler.image_patches, per_image) if sampler.image_patches else 0,
        prefix_buckets=sorted(set(sampler.prefix_buckets) | set(DEFAULT_TEXT_BUCKETS)),
        prompt_buckets=sorted(set(sampler.prompt_buckets) | set(DEFAULT_PROMPT_BUCKETS)),
    )


def online_config(
    sampler: SamplerConfig,
    image_config: ImageProcessorConfig,
    reward: RewardConfig,
    batch_size: int,
    temperature: float = 0.0,
    samples_per_task: int = 1,
) -> OnlineEvalConfig:
    """Online-evaluation settings: the job's ``sampler`` with patch buckets for ``batch_size`` screenshots, greedy by
    default, the leaf ``reward`` as step reward."""
    rc = RolloutConfig(sampler=sampler, image_config=image_config, batch_size=batch_size, reward=reward)
    return OnlineEvalConfig(rollout=rc, temperature=temperature, samples_per_task=samples_per_task)
