"""The ``ipl-jax`` command. Each subcommand is a small module of this package that parses its own arguments and
calls library functions; ``common.py`` holds what they share (the parser, one-line errors, the flags' meanings).
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

from ipl_jax import __version__

# subcommand -> (module, function, one-line help). Modules are imported only when their command runs.
COMMANDS = {
    "check-parity": ("ipl_jax.cli.check_parity", "main", "compare our Qwen2-VL with transformers on a checkpoint"),
    "make-tiny": ("ipl_jax.cli.make_tiny", "main", "write a random tiny Qwen2-VL checkpoint + tokenizer"),
    "init-model": ("ipl_jax.cli.init_model", "main", "a random Qwen2-VL-2B/7B checkpoint with our tokenizer"),
    "synth": ("ipl_jax.cli.synth", "main", "write a synthetic GUI-world split (AITZ or AndroidControl format)"),
    "score": ("ipl_jax.cli.score", "main", "score a predictions JSONL file against a dataset"),
    "pretrain": ("ipl_jax.cli.pretrain", "main", "a base model that reads the synthetic world's screens"),
    "sft": ("ipl_jax.cli.sft", "main", "warm-up SFT (the job's data, evolution, model and SFT stages)"),
    "eval": ("ipl_jax.cli.eval", "main", "greedy CoaT decoding + Step.Acc tables"),
    "export": ("ipl_jax.cli.export", "main", "export a checkpoint as a Hugging Face directory"),
    "select-start": ("ipl_jax.cli.select_start", "main", "choose the starting policy of the rounds by Acc_S / Div_R"),
    "sample": ("ipl_jax.cli.sample", "main", "sample CoaT-trees and write them as JSONL + HTML"),
    "run": ("ipl_jax.cli.run", "main", "the main job: data -> SFT -> IPL rounds -> evaluation"),
    "ablate": ("ipl_jax.cli.ablate", "main", "run the ablation table"),
    "plan": ("ipl_jax.cli.plan", "main", "per-device memory and FLOPs of the job's programs, compiled ahead of time"),
    "pack-data": ("ipl_jax.cli.pack_data", "main", "convert a dataset into ArrayRecord shards for Grain / TFDS"),
}
# a command's former name -> its name now: the old name still runs it, with a one-line notice
RENAMED = {"select-seed": "select-start"}


def _usage() -> str:
    lines = ["usage: ipl-jax [--version] COMMAND [ARGS...]   (ipl-jax COMMAND --help for its flags)", "", "commands:"]
    for name, (_, _, help_) in COMMANDS.items():
        lines.append(f"  {name:<14} {help_}")
    return "\n".join(lines)


def version() -> str:
    """The installed distribution's version (the package's own when it is not installed)."""

    try:
        return metadata.version("ipl-jax")
    except metadata.PackageNotFoundError:
        return __version__


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"ipl-jax {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in RENAMED:
        print(f"ipl-jax {name} is ipl-jax {RENAMED[name]} now; the old name still works", file=sys.stderr)
        name = RENAMED[name]
    if name not in COMMANDS:
        close = [c for c in COMMANDS if c.startswith(name[:2])]
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        print(f"ipl-jax: unknown command {name!r}{hint} (ipl-jax --help lists them)", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        print(f"ipl-jax: command {name!r} is not available: {e}", file=sys.stderr)
        return 2
    return int(fn(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
