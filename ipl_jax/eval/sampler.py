"""``ipl-jax sample``: sample CoaT-trees for the first steps of a dataset split, write them as JSONL and HTML.

    ipl-jax sample --checkpoint DIR --data DIR [--format aitz] [--split S] [--steps N] --out trees.jsonl
                   [--html OUT.html] [--branching 3 3 3 1] [--max-turn-tokens 256 128 32 32]
                   [--temperature 1.0] [--top-k 0] [--top-p 1.0] [--batch-size 4] [--seed 0] [--mesh]

The checkpoint is a Hugging Face Qwen2-VL directory (weights, tokenizer, preprocessor config). Each output line
is one tree (``ipl_jax.sampling.tree_records.tree_record``): node texts, leaf actions, leaf values, backed-up
node values and the α/β/γ class. The sampler library itself lives in ``ipl_jax.sampling``; its main names are
re-exported here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ipl_jax.sampling import (SampledBatch, SamplerConfig, StepPrompts, TreePrompts, greedy_config,  # noqa: F401
                              iter_sampled_batches, pack_tree_prompts, sample_tree, sample_tree_no_sharing,
                              step_prompts)

from ipl_jax.data.datasets import dataset_steps  # noqa: F401  (re-exported for callers of this module)
from ipl_jax.eval.policy import load_policy  # noqa: F401

DEFAULT_STEPS = 8


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ipl-jax sample", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="Hugging Face Qwen2-VL directory (model + tokenizer)")
    p.add_argument("--data", required=True, help="dataset root directory")
    p.add_argument("--format", default="aitz", dest="fmt", help="dataset format (aitz, amex, androidcontrol)")
    p.add_argument("--split", default="train")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="sample trees for the first N steps")
    p.add_argument("--out", required=True, help="output JSONL, one tree per line")
    p.add_argument("--html", default=None, help="also write a self-contained HTML viewer here")
    p.add_argument("--branching", type=int, nargs=4, default=(3, 3, 3, 1), metavar=("B1", "B2", "B3", "B4"))
    p.add_argument("--max-turn-tokens", type=int, nargs=4, default=(256, 128, 32, 32),
                   metavar=("T1", "T2", "T3", "T4"))
    p.add_argument("--temperature", type=float, default=1.0, help="turns 1-3; the grounding turn is greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--discount", type=float, default=0.95, help="value backup discount c (method.md §5)")
    p.add_argument("--mesh", action="store_true", help="shard over every device (batch over data x fsdp)")
    return p


def sample_main(argv: list[str]) -> int:
    """``ipl-jax sample``; 0 on success, 1 on bad input."""
    args = _parser().parse_args(argv)
    from ipl_jax.coat.metrics import DEFAULT_RULES
    from ipl_jax.coat.rewards import RewardConfig
    from ipl_jax.eval.trees import score_tree_batch
    from ipl_jax.sampling.tree_records import leaf_actions, tree_record, turn_texts

    try:
        params, cfg, tokenizer, image_config, mesh = load_policy(args.checkpoint, args.mesh)
        _, steps = dataset_steps(args.data, args.fmt, args.split, args.steps)
        t = float(args.temperature)
        config = SamplerConfig.for_tokenizer(
            tokenizer, branching=tuple(args.branching), max_turn_tokens=tuple(args.max_turn_tokens),
            temperature=(t, t, t, 0.0), top_k=args.top_k, top_p=args.top_p)
    except (FileNotFoundError, ValueError) as e:
        print(f"ipl-jax sample: {e}", file=sys.stderr)
        return 1
    if not steps:
        print(f"ipl-jax sample: no steps in {args.data} (format {args.fmt}, split {args.split})", file=sys.stderr)
        return 1
    reward_config = RewardConfig(rules=DEFAULT_RULES.get(args.fmt, "aitz"))
    records, counts = [], {"alpha": 0, "beta": 0, "gamma": 0}
    t0 = time.time()
    for batch in iter_sampled_batches(params, cfg, tokenizer, image_config, steps, config, args.seed,
                                      min(args.batch_size, len(steps)), mesh):
        texts = turn_texts(batch.tree, tokenizer)
        actions = leaf_actions(texts)
        scores = score_tree_batch(actions, batch.steps, batch.tree.step_valid, reward_config, args.discount)
        for row in range(batch.num_valid):
            rec = tree_record(batch.tree, row, texts, actions, scores, batch.steps[row], args.discount)
            records.append(rec)
            counts[rec["class"]] += 1
    seconds = time.time() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if args.html:
        from ipl_jax.viz.viewer import write_html

        images = []
        for s in steps[:len(records)]:
            try:
                images.append(s.load_image())
            except (OSError, ValueError):
                images.append(None)
        write_html(args.html, records, images, title=f"CoaT-trees: {Path(args.data).name} / {args.split}")
    n = len(records)
    summary = {"trees": n, "leaves_per_tree": int(config.branching[0] * config.branching[1] * config.branching[2]
                                                    * config.branching[3]),
               "seconds": round(seconds, 2), **{k: v / n for k, v in counts.items()}, "out": str(out)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(sample_main(sys.argv[1:]))
