"""``ipl-jax pack-data``: convert a dataset once into ArrayRecord shards of step records.

Read back with ``data.format = "arrayrecord"``. Exit status 0; 2 for a bad invocation; 1 for a malformed
source record (without ``--skip-bad``).
"""

from __future__ import annotations

import sys

from ipl_jax.cli.common import CommandParser, add_skip_bad, command, positive_int, report_skipped
from ipl_jax.data.packed.writer import DATASETS, check_out, pack_dataset, source_splits
from ipl_jax.pipeline.paths import UsageError, input_dir, output_dir
from ipl_jax.progress import progress

PROG = "ipl-jax pack-data"


def parser() -> CommandParser:

    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--format",
        required=True,
        choices=DATASETS,
        dest="fmt",
        help="the source's layout (synthetic: a directory written by ipl-jax synth, AITZ layout)",
    )
    p.add_argument("--data", required=True, help="the source dataset's root directory")
    p.add_argument("--out", required=True, help="output directory (new, empty, or an earlier pack to replace)")
    p.add_argument(
        "--shards",
        type=positive_int,
        default=1,
        help="ArrayRecord files per split (a multiple of the number of processes that will read it)",
    )
    p.add_argument("--splits", default=None, help="comma-separated splits to pack (default: every split found)")
    add_skip_bad(p, "leave malformed source records out (counted in the metadata) instead of stopping")
    return p


@command(PROG)
def main(argv: list[str]) -> int:

    args = parser().parse_args(argv)
    out = output_dir(args.out, "--out")
    root = input_dir(args.data, "--data", f"a {args.fmt} dataset root")
    splits = None if args.splits is None else [s for s in args.splits.split(",") if s]
    try:
        check_out(out, root)
        available = source_splits(args.fmt, root)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    missing = [s for s in (splits or available) if s not in available]
    if missing or not available:
        raise UsageError(
            f"--data {root}: no split {', '.join(missing) or '(none found)'} in this {args.fmt} data "
            f"(found: {', '.join(available) or 'none'}; check --format)"
        )

    def on_split(split, n_episodes, skipped):
        report_skipped(PROG, skipped, f"{root} split {split!r}")

    bar = progress(desc="pack-data", unit="step")
    try:
        meta = pack_dataset(
            args.fmt,
            root,
            out,
            shards=args.shards,
            splits=splits,
            skip_bad=args.skip_bad,
            on_split=on_split,
            on_step=lambda: bar.update(1),
        )
    finally:
        bar.close()
    for split, info in meta["splits"].items():
        skipped = f", {info['skipped']} malformed records skipped" if info["skipped"] else ""
        print(f"{split}: {info['episodes']} episodes, {info['steps']} steps in {len(info['files'])} shards{skipped}")
    print(f"wrote {out} ({meta['dataset']}, source sha256 {meta['source_sha256'][:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
