"""``ipl-jax synth``: write synthetic-world splits in the AITZ format.

    ipl-jax synth --out DIR --split NAME --episodes N --seed S [--config k=v ...]

``--split all`` writes every split with its default size (``--episodes`` then scales them all).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from ipl_jax.data.synthetic.aitz_writer import write_aitz_split
from ipl_jax.data.synthetic.config import WorldConfig, apply_overrides
from ipl_jax.data.synthetic.dataset import DEFAULT_SIZES, SPLITS, config_to_json, generate_split


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ipl-jax synth", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="root directory; a split goes to OUT/NAME/<subset>/...")
    p.add_argument("--split", default="train", choices=SPLITS + ("all",))
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes to write (default: the split's default size; with --split all, train's size "
                        "and the others scaled alike)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", nargs="+", action="extend", default=[], metavar="K=V",
                   help="WorldConfig overrides, e.g. width=252 height=504 n_contacts=4,20")
    p.add_argument("--with-meta", action="store_true",
                   help="add a synth_meta field (app, page, subset, transitions, intent) to every step record")
    p.add_argument("--png-level", type=int, default=1, help="PNG compression level 0..9 (1: fast, ~20%% larger than 6)")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        config = apply_overrides(WorldConfig(), args.config)
    except ValueError as e:
        print(f"ipl-jax synth: {e}", file=sys.stderr)
        return 2
    if args.episodes is not None and args.episodes < 0:
        print("ipl-jax synth: --episodes must be >= 0", file=sys.stderr)
        return 2
    if args.split == "all":
        scale = 1.0 if args.episodes is None else args.episodes / DEFAULT_SIZES["train"]
        plan = {s: max(1, round(n * scale)) for s, n in DEFAULT_SIZES.items()}
    else:
        plan = {args.split: DEFAULT_SIZES[args.split] if args.episodes is None else args.episodes}
    for split, n in plan.items():
        t0 = time.perf_counter()
        episodes = generate_split(split, n, seed=args.seed, config=config)
        split_dir = write_aitz_split(episodes, args.out, split, compress_level=args.png_level,
                                     with_meta=args.with_meta)
        types = collections.Counter(s.action.type for e in episodes for s in e.steps)
        n_steps = sum(types.values())
        info = {"split": split, "episodes": len(episodes), "steps": n_steps, "seed": args.seed,
                "action_types": dict(sorted(types.items())), "config": config_to_json(config)}
        (split_dir / "synth_info.json").parent.mkdir(parents=True, exist_ok=True)
        (split_dir / "synth_info.json").write_text(json.dumps(info, indent=1))
        shares = ", ".join(f"{k} {v / max(1, n_steps):.0%}" for k, v in sorted(types.items()))
        print(f"{split}: {len(episodes)} episodes, {n_steps} steps -> {split_dir} "
              f"({time.perf_counter() - t0:.1f} s; {shares})")
    return 0
