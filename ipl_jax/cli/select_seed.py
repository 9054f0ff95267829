"""``ipl-jax select-seed``: score policy checkpoints by Acc_S and Div_R (method.md §9) and choose the seed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ipl_jax.eval.seed_selection import EMBEDDERS, choose, format_scores, sample_steps, score_candidates


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ipl-jax select-seed",
                                description="Score checkpoints by Acc_S and Div_R and choose the seed policy.")
    p.add_argument("--checkpoints", nargs="+", required=True, help="policy directories (Hugging Face format)")
    p.add_argument("--data", required=True, help="dataset root")
    p.add_argument("--format", default="aitz", dest="fmt", help="dataset format (default aitz)")
    p.add_argument("--split", default="train")
    p.add_argument("--steps", type=int, default=None, help="training steps sampled (default: the config's)")
    p.add_argument("--embedder", choices=EMBEDDERS, default=None)
    p.add_argument("--diversity-weight", type=float, default=None)
    p.add_argument("--json", default=None, help="write the scores and the choice as JSON")
    return p


def main(argv: list[str]) -> int:
    from ipl_jax.configs.loader import parse_args_with_config
    from ipl_jax.data.datasets import load_dataset
    from ipl_jax.pipeline.model_stage import load_policy

    args, config = parse_args_with_config(_parser(), argv, default_config="synthetic")
    sel = config.seed_selection
    n_steps = sel.steps if args.steps is None else args.steps
    embedder = sel.embedder if args.embedder is None else args.embedder
    weight = sel.diversity_weight if args.diversity_weight is None else args.diversity_weight
    try:
        episodes = load_dataset(args.data, args.fmt, args.split)
        steps = sample_steps([s for e in episodes for s in e.steps], int(n_steps), int(config.seed))
        if not steps:
            raise ValueError(f"{args.data}: split {args.split!r} has no steps")
        from ipl_jax.pipeline.model_stage import job_mesh

        mesh = job_mesh(config)
        candidates = [(str(c), load_policy(Path(c), mesh)) for c in args.checkpoints]
        scores, kind = score_candidates(candidates, steps, config, embedder=embedder)
    except (OSError, ValueError, ImportError) as e:
        print(f"ipl-jax select-seed: {e}", file=sys.stderr)
        return 1
    chosen = choose(scores, float(weight))
    print(format_scores(scores, chosen))
    print(f"\nseed: {scores[chosen].name}  (rule: max Acc_S + {weight} * Div_R / max Div_R; "
          f"{len(steps)} steps, embedder {kind})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"candidates": [s.to_json() for s in scores], "chosen": chosen,
                                               "seed": scores[chosen].name, "embedder": kind,
                                               "diversity_weight": weight, "steps": len(steps)}, indent=1))
    return 0
