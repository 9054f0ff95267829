"""The ``ipl-jax`` command. Each subcommand lives in its own module and parses its own arguments."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one-line help). Modules are imported only when their command runs.
COMMANDS = {
    "check-parity": ("ipl_jax.model.parity", "main", "compare our Qwen2-VL with transformers on a checkpoint"),
    "make-tiny": ("ipl_jax.data.tiny", "main", "write a random tiny Qwen2-VL checkpoint + tokenizer"),
    "synth": ("ipl_jax.data.synthetic.cli", "main", "write a synthetic GUI-world split in the AITZ format"),
    "score": ("ipl_jax.eval.evaluate", "score_main", "score a predictions JSONL file against a dataset"),
    "sft": ("ipl_jax.pipeline", "sft_main", "warm-up SFT (the job's data, evolution, model and SFT stages)"),
    "eval": ("ipl_jax.eval.evaluate", "eval_main", "greedy CoaT decoding + Step.Acc tables"),
    "export": ("ipl_jax.cli.export", "main", "export a checkpoint as a Hugging Face directory"),
    "select-seed": ("ipl_jax.cli.select_seed", "main", "Acc_S / Div_R seed-policy selection"),
    "sample": ("ipl_jax.eval.sampler", "sample_main", "sample CoaT-trees and write them as JSONL + HTML"),
    "run": ("ipl_jax.pipeline", "main", "the main job: data -> SFT -> IPL rounds -> evaluation"),
    "ablate": ("ipl_jax.pipeline", "ablate_main", "run the ablation table"),
}


def _usage() -> str:
    lines = ["usage: ipl-jax COMMAND [ARGS...]", "", "commands:"]
    for name, (_, _, help_) in COMMANDS.items():
        lines.append(f"  {name:<14} {help_}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"ipl-jax: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        print(f"ipl-jax: command {name!r} is not available: {e}", file=sys.stderr)
        return 2
    rc = fn(rest)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
