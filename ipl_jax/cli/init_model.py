"""``ipl-jax init-model --architecture qwen2-vl-2b|qwen2-vl-7b --out DIR``: a Hugging Face checkpoint of a
published Qwen2-VL architecture with random weights and our tokenizer (real shapes, bfloat16, nothing downloaded).

``--dry-run`` lists the tensors and sizes without writing. Host memory peaks at one 4 GiB shard.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path

from ipl_jax.cli.common import CommandParser, command, seed_int
from ipl_jax.cli.make_tiny import read_json_arg
from ipl_jax.pipeline.init_model import DTYPES, checkpoint_config, tensor_shapes, write_random_checkpoint
from ipl_jax.pipeline.paths import UsageError, output_dir
from ipl_jax.planning.shapes import ARCHITECTURES

PROG = "ipl-jax init-model"


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--architecture", required=True, choices=tuple(ARCHITECTURES), help="the published model's shapes")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed of the weights")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weight dtype (the published: bfloat16)")
    p.add_argument("--dry-run", action="store_true", help="list the tensors and sizes; write nothing")
    p.add_argument("--overwrite", action="store_true", help="replace a checkpoint already in --out")
    p.add_argument("--override", default=None, help="config.json fields to change (a JSON object or file)")
    return p


def _claim(out: Path, overwrite: bool) -> None:
    """Refuse a directory that already holds a checkpoint unless ``overwrite`` (which removes its weights)."""
    held = [p for p in out.glob("*") if p.name == "config.json" or ".safetensors" in p.name] if out.is_dir() else []
    if held and not overwrite:
        raise UsageError(f"--out {out}: already holds a checkpoint ({held[0].name}); pass --overwrite or another --out")
    for p in held:
        if p.is_file():
            p.unlink()
        else:
            shutil.rmtree(p)


@command(PROG)
def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    out = None if args.dry_run else output_dir(args.out, "--out")  # checked before any work
    overrides = read_json_arg(args.override, "--override") if args.override else None
    try:
        hf_config = checkpoint_config(args.architecture, overrides, args.dtype)
    except ValueError as e:
        raise UsageError(str(e)) from None
    shapes = tensor_shapes(hf_config)
    n_params = sum(math.prod(s) for _, s in shapes)
    itemsize = 4 if args.dtype == "float32" else 2
    if args.dry_run:
        for name, shape in shapes:
            print(f"{name}\t{list(shape)}")
        print(
            f"{args.architecture}: {len(shapes)} tensors, {n_params:,} parameters, "
            f"{n_params * itemsize / 1e9:.2f} GB in {args.dtype}"
        )
        return 0
    _claim(out, args.overwrite)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = write_random_checkpoint(out, hf_config, seed=args.seed)
    ids = summary["special_ids"]
    print(
        f"wrote {out}: {args.architecture}, {summary['parameters'] / 1e9:.3f} B parameters, "
        f"{summary['bytes'] / 1e9:.2f} GB {args.dtype} in {len(summary['files'])} file(s); tokenizer "
        f"{summary['tokenizer_size']} ids (image_token_id {ids['image_token_id']}, vocab_size "
        f"{hf_config.get('text_config', hf_config)['vocab_size']}) ({time.perf_counter() - t0:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
