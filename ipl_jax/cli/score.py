"""``ipl-jax score``: the Step.Acc table of a predictions JSONL file against a dataset split.

Predictions format: docs/formats.md. Exit status 0; 2 for a bad invocation; 1 for a malformed predictions
line or data record.
"""

from __future__ import annotations

import json
import sys

from ipl_jax.cli.common import CommandParser, add_skip_bad, command, report_skipped, write_text
from ipl_jax.coat.metrics import DEFAULT_RULES, FORMATS, RULES
from ipl_jax.coat.tables import format_table, score_episodes
from ipl_jax.data.datasets import load_dataset_with_report
from ipl_jax.data.records import DataError
from ipl_jax.eval.predictions import load_predictions
from ipl_jax.pipeline.paths import UsageError, input_dir, input_file, output_file

PROG = "ipl-jax score"


def parser() -> CommandParser:

    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="dataset root directory")
    p.add_argument("--format", required=True, choices=FORMATS, dest="fmt", help="dataset format")
    p.add_argument("--predictions", required=True, help="predictions JSONL file (see docs/formats.md)")
    p.add_argument(
        "--split", default="test", help="dataset split (default: test; for AMEX 'all' reads every episode file)"
    )
    p.add_argument(
        "--rules",
        choices=tuple(RULES),
        default=None,
        help="matching rule set (default: the format's own: "
        + ", ".join(f"{k}->{v}" for k, v in DEFAULT_RULES.items())
        + ")",
    )
    p.add_argument("--json", default=None, help="also write the metric table as JSON to this file")
    add_skip_bad(p)
    return p


def load_split(prog: str, data: str, fmt: str, split, skip_bad: bool):
    """The episodes of a dataset split; a missing split is a usage error, skipped records are reported."""

    input_dir(data, "--data", f"a {fmt} dataset root")
    try:
        episodes, skipped = load_dataset_with_report(data, fmt, split, skip_bad=skip_bad)
    except DataError:
        raise  # a malformed record: exit status 1, the record named
    except (FileNotFoundError, ValueError) as e:  # no such split / subsplit
        raise UsageError(f"--data {data} --split {split}: {e}") from None
    report_skipped(prog, skipped, f"{data} ({fmt}, split {split})")
    if not episodes:
        raise UsageError(
            f"--data {data}: no episodes in split {split!r} (format {fmt}); check --data, --format and --split"
        )
    return episodes


@command(PROG)
def main(argv: list[str]) -> int:

    args = parser().parse_args(argv)
    if args.json:
        output_file(args.json, "--json")
    # a URI: read from this host's copy of it
    args.data = str(input_dir(args.data, "--data", f"a {args.fmt} dataset root"))
    predictions = load_predictions(str(input_file(args.predictions, "--predictions", "a predictions JSONL file")))
    episodes = load_split(PROG, args.data, args.fmt, args.split, args.skip_bad)
    table = score_episodes(episodes, predictions, args.fmt, args.rules)
    step_keys = {(str(s.episode_id), int(s.step_id)) for ep in episodes for s in ep.steps}
    table["predictions_unmatched"] = sum(k not in step_keys for k in predictions)
    table["steps_without_prediction"] = sum(k not in predictions for k in step_keys)
    print(format_table(table))
    if table["predictions_unmatched"] or table["steps_without_prediction"]:
        print(
            f"\nnote: {table['steps_without_prediction']} steps had no prediction (scored as misses); "
            f"{table['predictions_unmatched']} predictions matched no step of the split (ignored)"
        )
    if args.json:
        write_text(args.json, json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
