"""The evaluation stages (``eval_start``, ``eval_export``) and the evaluations the other stages run: the test splits,
the live world, the dev early-stopping signal, and the scoring of the SFT candidates that chooses the starting
policy (``start_scoring``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import jax

from ipl_jax import distributed, storage
from ipl_jax.data.datasets import scoring_format
from ipl_jax.data.records import Episode
from ipl_jax.envs import open_envs, suite_tasks
from ipl_jax.envs.protocol import EnvTask
from ipl_jax.eval.evaluate import EvalConfig, evaluate_policy
from ipl_jax.eval.online import TASK_FIELDS, any_screen_buckets, online_config, online_eval
from ipl_jax.eval.reading import SCORES as READING_SCORES
from ipl_jax.eval.reading import reading_scores
from ipl_jax.pipeline.model_stage import Policy
from ipl_jax.settings import Settings


def limit_episodes(episodes: Sequence[Episode], max_steps: int) -> list[Episode]:
    """Whole episodes, in order, until ``max_steps`` steps are reached (0: all)."""
    if max_steps <= 0:
        return list(episodes)
    out, n = [], 0
    for e in episodes:
        if n >= max_steps:
            break
        out.append(e)
        n += len(e.steps)
    return out


def eval_config(policy: Policy, settings: Settings, blank_screens: bool = False) -> EvalConfig:
    """``evaluate.EvalConfig`` of the job: its sampler settings (greedy) and the policy's image settings."""
    return EvalConfig(
        sampler=settings.sampler.build(policy.tokenizer.ids, settings.buckets, settings.eval.batch_size),
        image_config=policy.image_config,
        batch_size=settings.eval.batch_size,
        fmt=scoring_format(settings.data.format, settings.data.root),
        seed=settings.seed,
        blank_screens=blank_screens,
    )


def evaluate_splits(
    policy: Policy,
    splits: dict[str, list[Episode]],
    names: Sequence[str],
    settings: Settings,
    out_dir: Path,
    echo=print,
    blank_screens: bool = False,
) -> tuple[dict, dict]:
    """Greedy CoaT decoding of each split in ``names``: ({split: Step.Acc table}, {split: reading scores}
    (``eval.reading``)); predictions go to ``out_dir/<split>.predictions.jsonl``
    (``<split>.blank.predictions.jsonl`` with grey ``blank_screens``)."""
    storage.make_dir(out_dir)
    ec = eval_config(policy, settings, blank_screens)
    tables, reading = {}, {}
    for name in names:
        t0 = time.perf_counter()
        episodes = limit_episodes(splits[name], settings.eval.max_steps)
        records, table = evaluate_policy(policy.params, policy.cfg, policy.tokenizer, episodes, ec, policy.mesh)
        suffix = ".blank" if blank_screens else ""
        if distributed.is_main():
            with storage.as_path(out_dir / f"{name}{suffix}.predictions.jsonl").open("w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        tables[name] = table
        reading[name] = reading_scores([s for e in episodes for s in e.steps], records)
        echo(
            f"  {name}{' (blank screens)' if blank_screens else ''}: step accuracy "
            f"{100 * (table['step_acc'] or 0):.2f}% on {len(records)} steps, {reading_line(reading[name])} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    return tables, reading


def reading_line(scores: dict) -> str:
    """``reading: page 80.0%, texts 41.2%, grounding 55.0%`` ("-" where a score does not apply)."""
    cells = [f"{k} {'-' if scores.get(k) is None else f'{100 * scores[k]:.1f}%'}" for k in READING_SCORES]
    return "reading: " + ", ".join(cells)


def evaluate_policy_splits(
    policy: Policy, splits: dict[str, list[Episode]], settings: Settings, out_dir: Path, echo=print
) -> dict:
    """A round's evaluation record: ``metrics`` and ``reading`` (test splits), ``blank`` and ``blank_reading``
    (blank screenshots), and ``online``."""
    test = list(settings.data.test_splits)
    out: dict = {}
    out["metrics"], out["reading"] = evaluate_splits(policy, splits, test, settings, out_dir, echo=echo)
    blank = [s for s in settings.eval.blank_splits if s]
    if blank:
        out["blank"], out["blank_reading"] = evaluate_splits(
            policy, splits, blank, settings, out_dir, echo=echo, blank_screens=True
        )
    if settings.eval.online_episodes > 0:
        names = online_split_names(settings)
        by_split = {s: evaluate_online(policy, settings, s, out_dir, echo=echo) for s in names}
        out["online"] = by_split[names[0]]
        out["online_splits"] = by_split
    return out


def online_split_names(settings: Settings) -> tuple[str, ...]:
    """What the live-world evaluation plays: the synthetic world's ``eval.online_splits``, or AndroidWorld's suite
    once (named after the world)."""
    return settings.eval.online_splits if settings.env.kind == "synthetic" else (settings.env.kind,)


def job_env_tasks(
    settings: Settings, split: str, n: int | None = None, max_steps: int = 25, step_factor: float = 2.0
) -> list[EnvTask]:
    """The live tasks the job's ``env`` plays: the synthetic job's split (the episodes' world seeds, tasks and
    config; ``n``: all by default; step limit ``min(max_steps, ceil(step_factor · expert steps))``), or the
    AndroidWorld suite's ``env.tasks`` (each task's own step budget; ``split`` unread)."""
    if settings.env.kind != "synthetic":
        return suite_tasks(settings.env)
    from ipl_jax.envs.synthetic.env import split_world_tasks

    data = settings.data
    if not data.synthetic:
        raise ValueError(f"online evaluation needs the synthetic world (config.data.format is {data.format!r})")
    n = data.episodes_for(split) if n is None else n
    return split_world_tasks(
        split, n, seed=settings.seed, config=settings.world, max_steps=max_steps, step_factor=step_factor
    )


def evaluate_online(policy: Policy, settings: Settings, split: str, out_dir: Path, echo=print) -> dict:
    """Greedy episodes in the job's live world (``env``) on the first ``eval.online_episodes`` tasks of ``split``
    (AndroidWorld: its suite; written to ``out_dir/online.<split>.episodes.jsonl``); returns the summary
    (success_rate, its interval, mean_steps, failed episodes, ...)."""
    t0 = time.perf_counter()
    e = settings.eval
    tasks = job_env_tasks(settings, split, e.online_episodes, max_steps=e.online_max_steps)
    oc = job_online_config(settings, policy.tokenizer, policy.image_config, e.batch_size)
    rng = jax.random.PRNGKey(settings.seed)
    envs = open_envs(settings.env, e.batch_size)
    out = online_eval(policy.params, policy.cfg, policy.tokenizer, tasks, envs, rng, oc, policy.mesh)
    storage.make_dir(out_dir)
    detail = out.pop("episodes_detail", [])
    if distributed.is_main():
        with storage.as_path(out_dir / f"online.{split}.episodes.jsonl").open("w", encoding="utf-8") as f:
            for r in detail:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tasks = [{k: r.get(k) for k in TASK_FIELDS} for r in detail]  # per episode: success, steps, wall time, error
    out = {"split": split, **out, "tasks": tasks, "seconds": round(time.perf_counter() - t0, 2)}
    echo(
        f"  online ({out['split']}, {out['episodes']} episodes): success {100 * out['success_rate']:.1f}%, "
        f"wrong stops {100 * out['wrong_stop_rate']:.1f}%, step limit {100 * out['truncated_rate']:.1f}%, "
        f"mean steps {out['mean_steps']:.2f}{failed_note(out)} ({out['seconds']:.1f} s)"
    )
    return out


def job_online_config(settings: Settings, tokenizer, image_config, batch_size: int):
    """The job's greedy online evaluation of ``batch_size`` screens per sampler call: its sampler with patch buckets
    for them (up to the processor's ``max_pixels`` on a world other than the synthetic one, whose screens the job's
    buckets were not fitted to) and its leaf reward as step reward."""
    greedy = settings.sampler.build(tokenizer.ids, settings.buckets, settings.eval.batch_size, greedy=True)
    greedy = greedy.with_patch_buckets(settings.buckets.patch_buckets(batch_size))
    if settings.env.kind != "synthetic":
        greedy = any_screen_buckets(greedy, image_config, batch_size)
    return online_config(greedy, image_config, settings.reward.build(settings.data.rules()), batch_size)


def failed_note(summary: dict) -> str:
    """``, 2 failed (http://h:5000: ...)`` where environments failed episodes, else empty."""
    n = summary.get("failed_episodes") or 0
    if not n:
        return ""
    first = next(iter(summary.get("errors", {}).values()), "")
    return f", {n} failed ({first})"


def dev_accuracy(policy: Policy, dev_episodes: Sequence[Episode], settings: Settings) -> dict:
    """Dev step / type accuracy of greedy decoding (the round loop's early-stopping signal)."""
    episodes = limit_episodes(dev_episodes, settings.eval.max_steps)
    _, table = evaluate_policy(
        policy.params, policy.cfg, policy.tokenizer, episodes, eval_config(policy, settings), policy.mesh
    )
    return {"step_accuracy": float(table["step_acc"] or 0.0), "type_accuracy": float(table["total"]["type_acc"] or 0)}


def start_scoring(settings) -> dict:
    """``eval.start_selection.score_candidates``' sampler, reward, discount, seed and batch size as the job's
    settings (``Settings``) say."""
    return {
        "sampler_config": lambda tok: settings.sampler.build(tok.ids, settings.buckets, settings.eval.batch_size),
        "reward": settings.reward.build(settings.data.rules()),
        "discount": settings.reward.discount,
        "seed": settings.seed,
        "batch_size": settings.sampler.batch_size,
    }
