"""``ipl-jax run``: the main job, resumable stage by stage (``ipl_jax/pipeline/run.py``).

Everything is checked before anything is written; rerunning resumes. Multi-host: ``--coordinator``,
``--num-processes``, ``--process-id`` (TPU pods and SLURM need no flags).
"""

from __future__ import annotations

import sys

from ipl_jax import distributed
from ipl_jax.cli.common import CommandParser, command
from ipl_jax.configs.loader import parse_args_with_settings
from ipl_jax.pipeline.paths import UsageError, output_dir
from ipl_jax.pipeline.run import STAGES, run_job
from ipl_jax.pipeline.sources import check_job
from ipl_jax.pipeline.workdir import FORMER_STAGES

PROG = "ipl-jax run"


def job_settings(parser: CommandParser, argv: list[str], remote: bool = False):
    """(args, settings) of a job command: ``--config FILE[:VARIANT]`` (default ``synthetic``) and overrides, checked
    with the sources, machine and ``--workdir`` (a multi-process launch joined) before any work. ``remote``: the
    workdir may be an object-store URI (``gs://BUCKET/run``, checked on its store), else local only."""
    distributed.add_flags(parser)
    args, settings = parse_args_with_settings(parser, argv, default_config="synthetic")
    start_distributed(args)
    output_dir(args.workdir, "--workdir", remote=remote)
    check_job(settings)
    return args, settings


def start_distributed(args) -> None:
    """``distributed.initialize`` from the command's flags; a bad combination is a usage error."""
    try:
        distributed.initialize_from_args(args)
    except distributed.DistributedError as e:
        raise UsageError(str(e)) from None


def stage_name(text: str) -> str:
    """argparse type of ``--stop-after``: a stage; a former stage name (``workdir.FORMER_STAGES``) is today's, said in
    one line."""
    current = {old: new for new, old in FORMER_STAGES.items()}.get(text)
    if current is None:
        return text
    print(f"{PROG}: --stop-after {text} is --stop-after {current} now; the old name still works", file=sys.stderr)
    return current


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="job directory (created; reused to resume)")
    p.add_argument(
        "--stop-after", type=stage_name, choices=STAGES, default=None, help="stop once this stage is finished"
    )
    return p


@command(PROG)
def main(argv: list[str]) -> int:
    args, settings = job_settings(parser(), argv, remote=True)
    run_job(settings, args.workdir, args.stop_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
