"""``ipl-jax eval``: greedy four-turn CoaT decoding of every step of a dataset split with a Hugging Face model,
scored with the benchmark's Step.Acc table; with ``--online``, whole episodes in a live world.

Online (``--env``, default the config's ``env.kind``): in the synthetic world, greedy episodes in the worlds of the
split's first N episodes, success is stopping with the goal reached, the step limit min(--max-steps, 2 x the
expert's steps); on AndroidWorld (``--env androidworld --env-url URL``, repeated: one server per emulator), the
suite's tasks (``--tasks``) spread over the servers, each scored by the task itself. Servers are checked before
the model loads.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax

from ipl_jax import distributed
from ipl_jax.cli.common import CommandParser, add_skip_bad, command, positive_int, require, write_text
from ipl_jax.cli.run import start_distributed
from ipl_jax.cli.score import load_split
from ipl_jax.coat.metrics import FORMATS, RULES
from ipl_jax.coat.tables import format_table
from ipl_jax.configs.loader import parse_args_with_settings
from ipl_jax.envs import open_envs
from ipl_jax.envs.protocol import EnvError
from ipl_jax.envs.sections import ENV_KINDS
from ipl_jax.envs.synthetic.config import SPLITS
from ipl_jax.eval.evaluate import EvalConfig, evaluate_policy
from ipl_jax.eval.online import EpisodeLog, online_eval, summarize_records
from ipl_jax.eval.policy import load_policy
from ipl_jax.pipeline.eval_stage import failed_note, job_env_tasks, job_online_config
from ipl_jax.pipeline.paths import UsageError, input_dir, model_dir, output_file
from ipl_jax.pipeline.sources import check_env
from ipl_jax.sampling.config import WIDE_BUCKETS, SamplerConfig
from ipl_jax.settings import SettingsError

PROG = "ipl-jax eval"


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        "--checkpoint",
        dest="model",
        required=True,
        help="Hugging Face model directory (weights + tokenizer): an export, a job's round policy, a published one",
    )
    p.add_argument("--data", default=None, help="dataset root directory")
    p.add_argument("--format", default=None, choices=FORMATS, dest="fmt", help="dataset format")
    p.add_argument(
        "--split", default=None, help="split (default: test; online: the first of config.eval.online_splits)"
    )
    p.add_argument("--online", action="store_true", help="play whole episodes in a live world (--env)")
    p.add_argument(
        "--env",
        choices=ENV_KINDS,
        default=None,
        help="online: the live world (default: config.env.kind; implies --online)",
    )
    p.add_argument(
        "--env-url", action="append", default=None, help="online: an AndroidWorld server http://HOST:PORT (repeatable)"
    )
    p.add_argument("--tasks", default=None, help="online, AndroidWorld: the suite's tasks to play, NAME,NAME,...")
    p.add_argument("--episodes", type=positive_int, default=None, help="online: episodes (default: the config's)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="online: step limit cap (default: config's)")
    p.add_argument("--rules", choices=tuple(RULES), default=None, help="matching rule set (default: the format's)")
    p.add_argument("--json", default=None, help="write the metric table as JSON here")
    p.add_argument(
        "--predictions",
        default=None,
        help="write one JSON line per step here (raw turns, action, golden, verdicts; re-scorable with ipl-jax score);"
        " online: one line per episode",
    )
    p.add_argument("--steps", type=positive_int, default=None, help="evaluate only the first N steps")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default 8; online: config.eval.batch_size")
    p.add_argument(
        "--max-turn-tokens", type=positive_int, nargs=4, default=(256, 128, 32, 32), metavar=("T1", "T2", "T3", "T4")
    )
    p.add_argument("--mesh", action="store_true", help="shard over every device (batch over data x fsdp)")
    p.add_argument(
        "--blank-screens",
        action="store_true",
        help="replace every screenshot by a grey image of "
        "its size (the control that shows how much accuracy comes from reading the screen)",
    )
    add_skip_bad(p)
    return p


def load_model(flag: str, directory: str, mesh: bool):
    """``eval.policy.load_policy`` with its failures named after the flag (a URI: this host's copy of it)."""
    local = model_dir(directory, flag)
    try:
        return load_policy(str(local), mesh)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UsageError(f"{flag} {directory}: cannot be loaded: {e}") from None


def keep_steps(episodes, steps):
    """The episodes cut down to ``steps`` (the first N steps of the split), for scoring only what was decoded."""
    kept = {(str(s.episode_id), int(s.step_id)) for s in steps}
    out = [
        dataclasses.replace(ep, steps=tuple(s for s in ep.steps if (str(s.episode_id), int(s.step_id)) in kept))
        for ep in episodes
    ]
    return [ep for ep in out if ep.steps]


@command(PROG)
def main(argv: list[str]) -> int:
    p = parser()
    distributed.add_flags(p)
    args, job = parse_args_with_settings(p, argv, default_config="synthetic")
    start_distributed(args)  # before anything touches a device
    for flag, path in (("--json", args.json), ("--predictions", args.predictions)):
        if path:
            output_file(path, flag)
    if args.online or args.env or args.env_url or args.tasks is not None:
        return online(args, env_job(args, job))
    require(p, args, "data", "--data")
    require(p, args, "fmt", "--format")
    args.split = args.split or "test"
    args.model = str(model_dir(args.model, "--model"))  # a URI: this host's copy
    args.data = str(input_dir(args.data, "--data", f"a {args.fmt} dataset root"))
    episodes = load_split(PROG, args.data, args.fmt, args.split, args.skip_bad)
    if args.steps is not None:
        episodes = keep_steps(episodes, [s for ep in episodes for s in ep.steps][: args.steps])
    # several processes always share one mesh (each alone would decode the whole split)
    params, cfg, tokenizer, image_config, mesh = load_model(
        "--model", args.model, args.mesh or distributed.process_count() > 1
    )
    config = EvalConfig(
        sampler=SamplerConfig.for_tokenizer(tokenizer, max_turn_tokens=tuple(args.max_turn_tokens), **WIDE_BUCKETS),
        image_config=image_config,
        batch_size=args.batch_size or 8,
        fmt=args.fmt,
        rules=args.rules,
        blank_screens=args.blank_screens,
    )
    records, table = evaluate_policy(params, cfg, tokenizer, episodes, config, mesh)
    if not distributed.is_main():
        return 0  # the main process prints and writes
    print(format_table(table))
    if args.json:
        write_text(args.json, json.dumps(table, indent=2) + "\n")
    if args.predictions:
        write_text(args.predictions, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return 0


def env_job(args, job):
    """The job's settings with ``--env``, ``--env-url`` and ``--tasks`` in its ``env`` section."""
    values = {}
    if args.env:
        values["env.kind"] = args.env
    if args.env_url:
        values["env.urls"] = tuple(args.env_url)
    if args.tasks is not None:
        values["env.tasks"] = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
        if not values["env.tasks"]:
            raise UsageError(f"--tasks {args.tasks!r}: names no task (NAME,NAME,...; leave it out for the whole suite)")
    try:
        return job.replace(values) if values else job
    except SettingsError as e:
        field, _, why = e.why.partition(": ")
        flag = {"env.kind": "--env", "env.urls": "--env-url", "env.tasks": "--tasks"}.get(field)
        raise UsageError(f"{flag}: {why}" if flag else str(e)) from None


def online(args, job) -> int:
    """``--online``: ``eval.online.online_eval`` on the live tasks of the job's ``env`` (servers checked first);
    with ``--predictions``, a resumable run (``eval.online.EpisodeLog``: the episodes already there are not played
    again)."""
    synthetic = job.env.kind == "synthetic"
    split = (args.split or job.eval.online_splits[0]) if synthetic else job.env.kind
    if synthetic and split not in SPLITS:
        raise UsageError(f"--split {split!r}: the synthetic world's splits are {', '.join(SPLITS)}")
    if synthetic and not job.data.synthetic:
        raise UsageError(f"--config: data.format is {job.data.format!r}; --online plays the synthetic world")
    check_env(job, "--env-url")  # a wrong or dead server: one line, before any model loads
    args.model = str(model_dir(args.model, "--model"))
    n = args.episodes or job.eval.online_episodes or job.data.test_episodes
    max_steps = args.max_steps or job.eval.online_max_steps
    try:
        tasks = job_env_tasks(job, split, n, max_steps=max_steps)
    except EnvError as e:  # the client's line names the server or the flag
        raise UsageError(str(e)) from None
    if not synthetic and args.max_steps:  # AndroidWorld: --max-steps caps each task's own budget
        tasks = [dataclasses.replace(t, step_limit=min(t.step_limit, args.max_steps)) for t in tasks]
    try:
        log = EpisodeLog(args.predictions, write=distributed.is_main()) if args.predictions else None
    except ValueError as e:
        raise UsageError(f"--predictions {e}") from None
    todo = [t for t in tasks if log is None or t.name not in log.done]
    if len(todo) < len(tasks):
        print(f"resuming: {len(tasks) - len(todo)} of {len(tasks)} episodes already in {args.predictions}")
    records = play_online(args, job, todo, log) if todo else []
    records = log.finish(tasks) if log is not None else records
    if not distributed.is_main():
        return 0
    out = {"env": job.env.kind, "split": split, "seed": job.seed, "servers": list(job.env.urls)}
    out.update(resumed=len(tasks) - len(todo), **summarize_records(records))
    print_online(out)
    if args.json:
        write_text(args.json, json.dumps(out, indent=2) + "\n")
    return 0


def play_online(args, job, tasks, log) -> list[dict]:
    """The episode records of ``tasks`` played greedily by ``--model`` on the job's ``env`` (each appended to
    ``log`` as it ends)."""
    params, cfg, tokenizer, image_config, mesh = load_model("--model", args.model, args.mesh)
    bs = args.batch_size or job.eval.batch_size
    oc = job_online_config(job, tokenizer, image_config, bs)
    try:
        envs = open_envs(job.env, bs)
    except EnvError as e:
        raise UsageError(str(e)) from None
    on_episode = None if log is None else log.append
    out = online_eval(params, cfg, tokenizer, tasks, envs, jax.random.PRNGKey(job.seed), oc, mesh, on_episode)
    return out["episodes_detail"]


def print_online(out: dict) -> None:
    """The run's summary lines: success with its 95% interval, steps, failures; one line a family."""
    ci = out["success_ci95"]
    print(
        f"online {out['split']} (seed {out['seed']}, {out['episodes']} episodes): success rate "
        f"{100 * out['success_rate']:.1f}% (95% CI {100 * ci[0]:.1f}-{100 * ci[1]:.1f}%), mean steps "
        f"{out['mean_steps']:.2f}, truncated {100 * out['truncated_rate']:.1f}%, unparsable steps "
        f"{100 * out['unparsable_rate']:.1f}%{failed_note(out)}"
    )
    for fam, v in out["by_family"].items():
        print(
            f"  {fam:<24}{v['episodes']:>4} episodes  success {100 * v['success_rate']:5.1f}%  "
            f"steps {v['mean_steps']:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
