"""``ipl-jax synth``: write synthetic-world splits in the AITZ format (or AndroidControl's).

``--world K=V`` overrides ``WorldConfig`` (or ``--config``'s ``world`` section); a split that already holds
files is refused unless ``--overwrite``.
"""

from __future__ import annotations

import collections
import json
import shutil
import sys
import time
from pathlib import Path

from ipl_jax.cli.common import CommandParser, command, nonnegative_int, seed_int
from ipl_jax.configs.loader import parse_args_with_settings
from ipl_jax.envs.synthetic import android_control_writer as ac
from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
from ipl_jax.envs.synthetic.config import SPLITS, WorldConfig, apply_overrides
from ipl_jax.envs.synthetic.dataset import DEFAULT_SIZES, config_to_json, generate_split
from ipl_jax.pipeline.paths import UsageError, output_dir
from ipl_jax.progress import progress

PROG = "ipl-jax synth"
PNG_LEVELS = range(0, 10)
FORMATS = ("aitz", "android_control")


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="root directory; a split goes to OUT/NAME/<subset>/...")
    p.add_argument("--split", default="train", choices=SPLITS + ("all",))
    p.add_argument(
        "--episodes",
        type=nonnegative_int,
        default=None,
        help="episodes to write (default: the split's default size; with --split all, train's size "
        "and the others scaled alike)",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="random seed, 0 .. 2**32-1")
    p.add_argument(
        "--format",
        default="aitz",
        choices=FORMATS,
        help="aitz: CoaT-annotated folders; android_control: GZIP TFRecord shards without CoaT, each episode's final "
        "stop left out (AndroidControl has no action for it)",
    )
    p.add_argument(
        "--world",
        nargs="+",
        action="extend",
        default=[],
        metavar="K=V",
        help="WorldConfig field overrides, e.g. width=252 height=504 n_contacts=4,20",
    )
    p.add_argument(
        "--with-meta",
        action="store_true",
        help="add a synth_meta field (app, page, subset, transitions, intent) to every step record",
    )
    p.add_argument(
        "--png-level",
        type=int,
        default=1,
        choices=PNG_LEVELS,
        metavar="0..9",
        help="PNG compression level 0..9 (1: fast, ~20%% larger than 6)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace split folders that already hold files")
    return p


def world_of(argv: list[str]):
    """(args, WorldConfig) from the command line: ``WorldConfig``'s defaults, or a job config's ``world`` section
    with ``--config``, then the ``--world`` overrides."""
    p = parser()
    if any(a == "--config" or a.startswith("--config.") or a.startswith("--config=") for a in argv):
        args, settings = parse_args_with_settings(p, argv, default_config="synthetic")
        base = settings.world
    else:
        args, base = p.parse_args(argv), WorldConfig()
    try:
        return args, apply_overrides(base, args.world)
    except ValueError as e:
        raise UsageError(str(e)) from None


def plan_splits(split: str, episodes) -> dict[str, int]:
    """{split: episodes} to write."""
    if split == "all":
        scale = 1.0 if episodes is None else episodes / DEFAULT_SIZES["train"]
        return {s: max(1, round(n * scale)) for s, n in DEFAULT_SIZES.items()}
    return {split: DEFAULT_SIZES[split] if episodes is None else episodes}


def claim_split_dirs(out: Path, splits, overwrite: bool) -> None:
    """Refuse split folders that hold files (unless ``overwrite``, which empties them), before any work."""
    busy = [out / s for s in splits if (out / s).is_dir() and any((out / s).iterdir())]
    if busy and not overwrite:
        n = sum(1 for _ in busy[0].glob("*/*/*.json"))
        raise UsageError(
            f"--out {out}: split folder {busy[0]} already holds files ({n} episodes); pass "
            f"--overwrite to replace it, or choose another --out"
        )
    for d in busy:
        shutil.rmtree(d)
    for s in splits:
        if (out / s).exists() and not (out / s).is_dir():
            raise UsageError(f"--out {out}: {out / s} is a file; choose another --out")


def claim_shards(out: Path, splits, overwrite: bool) -> None:
    """``claim_split_dirs`` for AndroidControl: a split's shard is refused (or removed with ``overwrite``), as is a
    folder of AndroidControl data not written by ``ipl-jax synth``."""
    if (out / "splits.json").is_file() and not (out / ac.INFO).is_file():
        raise UsageError(
            f"--out {out}: holds an AndroidControl dataset not written by ipl-jax synth; choose another --out"
        )
    busy = [ac.shard_path(out, s) for s in splits if ac.shard_path(out, s).exists()]
    if busy and not overwrite:
        raise UsageError(
            f"--out {out}: shard {busy[0].name} already holds a split; pass --overwrite to replace it, or choose "
            f"another --out"
        )
    for shard in busy:
        shard.unlink()


@command(PROG)
def main(argv: list[str]) -> int:
    args, world = world_of(argv)
    out = output_dir(args.out, "--out")
    plan = plan_splits(args.split, args.episodes)
    aitz = args.format == "aitz"
    if not aitz and args.with_meta:
        raise UsageError("--with-meta: the AndroidControl layout has no field for the step meta; use --format aitz")
    (claim_split_dirs if aitz else claim_shards)(out, plan, args.overwrite)
    for split, n in plan.items():
        t0 = time.perf_counter()
        episodes = generate_split(split, n, seed=args.seed, config=world)
        # the steps written: AndroidControl's shard holds every step but the episodes' final stops
        types = collections.Counter(s.action.type for e in episodes for s in (e.steps if aitz else e.steps[:-1]))
        n_steps = sum(types.values())
        info = {
            "split": split,
            "episodes": len(episodes),
            "steps": n_steps,
            "seed": args.seed,
            "action_types": dict(sorted(types.items())),
            "config": config_to_json(world),
        }
        shown = progress(episodes, desc=f"synth {split}", unit="episode")
        if aitz:
            split_dir = write_aitz_split(shown, out, split, compress_level=args.png_level, with_meta=args.with_meta)
            split_dir.mkdir(parents=True, exist_ok=True)
            (split_dir / "synth_info.json").write_text(json.dumps(info, indent=1))
        else:
            split_dir = ac.write_android_control_split(shown, out, split, compress_level=args.png_level, info=info)
        shares = ", ".join(f"{k} {v / max(1, n_steps):.0%}" for k, v in sorted(types.items()))
        print(
            f"{split}: {len(episodes)} episodes, {n_steps} steps -> {split_dir} "
            f"({time.perf_counter() - t0:.1f} s; {shares})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
