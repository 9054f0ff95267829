"""``ipl-jax pretrain``: a base model that reads the synthetic world's screens (``ipl_jax/pipeline/pretrain.py``),
resumable; written to ``WORKDIR/pretrain/model`` with its recipe and reading scores in ``recipe.json``.
"""

from __future__ import annotations

import sys

from ipl_jax.cli.common import CommandParser, command
from ipl_jax.configs.loader import parse_args_with_settings
from ipl_jax.pipeline.paths import output_dir
from ipl_jax.pipeline.pretrain import run_pretrain
from ipl_jax.pipeline.sources import check_job

PROG = "ipl-jax pretrain"


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="pretraining directory (created; reused to resume)")
    p.add_argument(
        "--out",
        default=None,
        help="where the model goes (default WORKDIR/pretrain/model; ipl_jax/checkpoints/reader: the shipped base)",
    )
    return p


@command(PROG)
def main(argv: list[str]) -> int:
    args, settings = parse_args_with_settings(parser(), argv, default_config="pretrain")
    check_job(settings)  # a starting checkpoint (model.checkpoint) is read before any work
    output_dir(args.workdir, "--workdir")
    if args.out:
        output_dir(args.out, "--out")
    recipe = run_pretrain(settings, args.workdir, args.out)
    r = recipe["reading"]
    print(
        f"reading on {r['screens']} held-out screens: page {r['describe']}, texts {r['texts']}, where {r['where']}, "
        f"what {r['what']}; model: {args.out or args.workdir + '/pretrain/model'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
