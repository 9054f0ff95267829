"""``ipl-jax ablate``: IPL variants from one shared starting policy, printed as the paper's ablation table plus a
summary of each variant's gain over it with its 95 % paired-bootstrap interval (see ``ipl_jax/pipeline/ablate.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ipl_jax import distributed
from ipl_jax.cli.common import CommandParser, command
from ipl_jax.cli.run import job_settings
from ipl_jax.pipeline.ablate import (
    VARIANTS,
    format_ablation,
    format_seeds,
    parse_variant,
    run_ablation,
    run_seeds,
    variant_settings,
)
from ipl_jax.pipeline.sources import check_job
from ipl_jax.sections import SettingsError

PROG = "ipl-jax ablate"


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="directory of the base job and the variants (reused to resume)")
    p.add_argument(
        "--variants",
        default=None,
        help=f"comma-separated subset of {','.join(VARIANTS)} (default: config.ablation.variants)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='"NAME=[BASE] FIELD=VALUE ..."',
        help="a variant of your own, run after --variants from the same starting policy: BASE (optional) a variant "
        'above, then round settings (ipl.*, rl.*) it changes, e.g. --variant "tdpo_b05=tdpo ipl.dpo.beta=0.5" '
        "(repeatable)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds: each seed's ablation in WORKDIR/seed_<s>, then the table over them "
        "(mean ± sd, per seed intervals; WORKDIR/ablation_seeds.json); default: config.seed alone in WORKDIR",
    )
    return p


@command(PROG)
def main(argv: list[str]) -> int:
    p = parser()
    args, settings = job_settings(p, argv)
    names = [v.strip() for v in (args.variants.split(",") if args.variants else settings.ablation.variants)]
    names = [n for n in names if n]
    for n in names:
        if n not in VARIANTS:
            p.error(f"--variants: unknown variant {n!r}; known: {', '.join(VARIANTS)}")
    own = {}
    for text in args.variant:
        try:
            name, switches = parse_variant(text)
        except ValueError as e:
            p.error(str(e))
        own[name] = switches
        if name not in names:
            names.append(name)
    for n in names:
        try:  # every variant's settings, before the base job starts
            variant = variant_settings(settings, n, {**VARIANTS, **own})
        except SettingsError as e:
            p.error(f"--variant {n}: {e.why}" if n in own else str(e))
        check_job(variant)
    if args.seeds is None:
        result = run_ablation(settings, args.workdir, names, extra_variants=own)
        if distributed.is_main():
            print("\n" + format_ablation(result))
            print(f"\nwritten: {Path(args.workdir) / 'ablation.json'}")
        return 0
    seeds = seed_list(p, args.seeds)
    for s in seeds:
        settings.replace({"seed": s})  # a seed out of range ends here, in one line, before any job starts
    summary = run_seeds(settings, args.workdir, names, seeds, extra_variants=own)
    if distributed.is_main():
        print("\n" + format_seeds(summary))
        print(f"\nwritten: {Path(args.workdir) / 'ablation_seeds.json'}")
    return 0


def seed_list(p: CommandParser, text: str) -> list[int]:
    """``--seeds 0,1,2`` -> [0, 1, 2]; anything else ends in one line naming the flag."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts or not all(t.isdigit() for t in parts) or len(set(parts)) != len(parts):
        p.error(f"--seeds: {text!r} is not a comma-separated list of distinct non-negative integers (e.g. 0,1,2)")
    return [int(t) for t in parts]


if __name__ == "__main__":
    sys.exit(main())
