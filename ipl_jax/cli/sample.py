"""``ipl-jax sample``: sample CoaT-trees for the first steps of a dataset split, write them as JSONL and HTML.

Each output line is one tree: node texts, leaf actions, leaf values, backed-up node values, α/β/γ class.
"""

from __future__ import annotations

import json
import sys
import time

from ipl_jax import storage
from ipl_jax.cli.common import (
    CommandParser,
    add_skip_bad,
    command,
    nonnegative_int,
    positive_int,
    seed_int,
    write_text,
)
from ipl_jax.cli.eval import load_model
from ipl_jax.cli.score import load_split
from ipl_jax.coat.metrics import DEFAULT_RULES, FORMATS
from ipl_jax.eval.sampler import sample_records
from ipl_jax.pipeline.paths import UsageError, input_dir, model_dir, output_file
from ipl_jax.sampling.config import WIDE_BUCKETS, SamplerConfig
from ipl_jax.viz.viewer import write_html

PROG = "ipl-jax sample"
DEFAULT_STEPS = 8


def parser() -> CommandParser:

    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face Qwen2-VL model directory (weights + tokenizer)")
    p.add_argument("--data", required=True, help="dataset root directory")
    p.add_argument("--format", default="aitz", choices=FORMATS, dest="fmt", help="dataset format")
    p.add_argument("--split", default="train")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS, help="sample trees for the first N steps")
    p.add_argument("--out", required=True, help="output JSONL, one tree per line")
    p.add_argument("--html", default=None, help="also write a self-contained HTML viewer here")
    p.add_argument("--branching", type=positive_int, nargs=4, default=(3, 3, 3, 1), metavar=("B1", "B2", "B3", "B4"))
    p.add_argument(
        "--max-turn-tokens", type=positive_int, nargs=4, default=(256, 128, 32, 32), metavar=("T1", "T2", "T3", "T4")
    )
    p.add_argument("--temperature", type=float, default=1.0, help="turns 1-3; the grounding turn is greedy")
    p.add_argument("--top-k", type=nonnegative_int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--discount", type=float, default=0.95, help="value backup discount c (docs/method.md §5)")
    p.add_argument("--mesh", action="store_true", help="shard over every device (batch over data x fsdp)")
    add_skip_bad(p)
    return p


@command(PROG)
def main(argv: list[str]) -> int:

    p = parser()
    args = p.parse_args(argv)
    if not (args.temperature >= 0 and 0 < args.top_p <= 1 and 0 < args.discount <= 1):
        raise UsageError(
            f"--temperature must be >= 0, --top-p in (0, 1] and --discount in (0, 1]; got "
            f"{args.temperature}, {args.top_p}, {args.discount}"
        )
    output_file(args.out, "--out")
    if args.html:
        output_file(args.html, "--html")
    name = storage.as_path(args.data).name
    args.model = str(model_dir(args.model, "--model"))  # a URI: this host's copy
    args.data = str(input_dir(args.data, "--data", f"a {args.fmt} dataset root"))
    episodes = load_split(PROG, args.data, args.fmt, args.split, args.skip_bad)
    steps = [s for ep in episodes for s in ep.steps][: args.steps]
    params, cfg, tokenizer, image_config, mesh = load_model("--model", args.model, args.mesh)
    t = float(args.temperature)
    try:
        config = SamplerConfig.for_tokenizer(
            tokenizer,
            branching=tuple(args.branching),
            max_turn_tokens=tuple(args.max_turn_tokens),
            temperature=(t, t, t, 0.0),
            top_k=args.top_k,
            top_p=args.top_p,
            **WIDE_BUCKETS,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    t0 = time.time()
    records, counts = sample_records(
        params,
        cfg,
        tokenizer,
        image_config,
        steps,
        config,
        args.seed,
        min(args.batch_size, len(steps)),
        mesh,
        rules=DEFAULT_RULES.get(args.fmt, "aitz"),
        discount=args.discount,
    )
    seconds = time.time() - t0
    write_text(args.out, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records))
    if args.html:
        images = []
        for s in steps[: len(records)]:
            try:
                images.append(s.load_image())
            except (OSError, ValueError):
                images.append(None)
        write_html(args.html, records, images, title=f"CoaT-trees: {name} / {args.split}")
    n = len(records)
    leaves = 1
    for b in config.branching:
        leaves *= int(b)
    print(
        json.dumps(
            {
                "trees": n,
                "leaves_per_tree": leaves,
                "seconds": round(seconds, 2),
                **{k: v / n for k, v in counts.items()},
                "out": str(args.out),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
