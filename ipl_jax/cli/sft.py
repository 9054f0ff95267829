"""``ipl-jax sft``: the job's first stages only (data, instruction evolution, model, warm-up SFT).

The last ``sft.start_candidates`` checkpoints land in ``WORKDIR/sft/candidates/step_<n>``; ``ipl-jax run`` on
the same workdir goes on from there.
"""

from __future__ import annotations

import json
import sys

from ipl_jax.cli.common import CommandParser, command
from ipl_jax.cli.run import job_settings
from ipl_jax.pipeline.run import run_job

PROG = "ipl-jax sft"
SUMMARY_FIELDS = ("steps", "items", "final_loss", "mean_loss_last_10", "train_seconds", "tokens_per_s", "candidates")


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="job directory (created; reused to resume)")
    return p


@command(PROG)
def main(argv: list[str]) -> int:
    args, settings = job_settings(parser(), argv)
    wd = run_job(settings, args.workdir, stop_after="sft")
    summary = wd.summary("sft")
    wd.echo(json.dumps({k: summary.get(k) for k in SUMMARY_FIELDS}, indent=1))
    wd.echo(f"SFT candidates: {wd.path('sft', 'candidates')}  (metrics log: {wd.path('metrics.jsonl')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
