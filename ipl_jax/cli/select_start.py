"""``ipl-jax select-start``: score policy models by Acc_S and Div_R (docs/method.md §9) and choose the starting
policy of the IPL rounds (``select-seed``, its former name, still works)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ipl_jax.cli.common import CommandParser, add_skip_bad, command, positive_int, write_text
from ipl_jax.cli.score import load_split
from ipl_jax.coat.metrics import FORMATS
from ipl_jax.configs.loader import parse_args_with_settings
from ipl_jax.data.records import sample_steps
from ipl_jax.eval.embeddings import EMBEDDERS
from ipl_jax.eval.start_selection import choose, format_scores, score_candidates
from ipl_jax.pipeline.data_stage import split_annotations
from ipl_jax.pipeline.eval_stage import start_scoring
from ipl_jax.pipeline.model_stage import job_mesh, load_policy
from ipl_jax.pipeline.paths import UsageError, input_dir, model_dir, output_file

PROG = "ipl-jax select-start"


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="policy model directories (Hugging Face format)")
    p.add_argument("--data", required=True, help="dataset root")
    p.add_argument("--format", default="aitz", choices=FORMATS, dest="fmt", help="dataset format (default aitz)")
    p.add_argument("--split", default="train")
    p.add_argument("--steps", type=positive_int, default=None, help="training steps sampled (default: the config's)")
    p.add_argument("--embedder", choices=EMBEDDERS, default=None)
    p.add_argument("--diversity-weight", type=float, default=None)
    p.add_argument("--json", default=None, help="write the scores and the choice as JSON")
    add_skip_bad(p)
    return p


@command(PROG)
def main(argv: list[str]) -> int:
    p = parser()
    args, settings = parse_args_with_settings(p, argv, default_config="synthetic")
    if args.json:
        output_file(args.json, "--json")
    for m in args.models:
        model_dir(m, "--models")  # (a URI: load_policy reads this host's copy)
    args.data = str(input_dir(args.data, "--data", f"a {args.fmt} dataset root"))
    sel = settings.start_selection
    n_steps = sel.steps if args.steps is None else args.steps
    embedder = sel.embedder if args.embedder is None else args.embedder
    weight = sel.diversity_weight if args.diversity_weight is None else args.diversity_weight
    episodes = load_split(PROG, args.data, args.fmt, args.split, args.skip_bad)
    data = settings.data
    if args.split == "train" and data.action_episodes and not data.action_root:
        # a scarce-annotation config: the job scores its candidates on the annotated episodes it keeps
        episodes = split_annotations(episodes, data.annotated_episodes, data.action_episodes, settings.seed)[0]
    steps = sample_steps([s for e in episodes for s in e.steps], n_steps, settings.seed)
    mesh = job_mesh(settings.mesh)
    try:
        candidates = [(str(c), load_policy(Path(c), mesh)) for c in args.models]
        scores, kind = score_candidates(candidates, steps, **start_scoring(settings), embedder=embedder)
    except ImportError as e:  # the MiniLM embedder without its optional package
        raise UsageError(f"--embedder {embedder}: {e}") from None
    chosen = choose(scores, weight)
    print(format_scores(scores, chosen))
    print(
        f"\nstart: {scores[chosen].name}  (rule: max Acc_S + {weight} * Div_R / max Div_R; "
        f"{len(steps)} steps, embedder {kind})"
    )
    if args.json:
        write_text(
            args.json,
            json.dumps(
                {
                    "candidates": [s.to_json() for s in scores],
                    "chosen": chosen,
                    "start": scores[chosen].name,
                    "embedder": kind,
                    "diversity_weight": weight,
                    "steps": len(steps),
                },
                indent=1,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
