"""``ipl-jax check-parity --model DIR``: our logits against transformers' on one random text + image batch.

Prints the comparison as JSON. Exit status: 0 within tolerance, 1 above it, 2 when torch / transformers are
missing or the model directory cannot be used.
"""

from __future__ import annotations

import json
import sys

from ipl_jax.cli.common import CommandParser, command
from ipl_jax.model.parity import compare
from ipl_jax.pipeline.paths import UsageError, model_dir

PROG = "ipl-jax check-parity"


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face Qwen2-VL or Qwen2.5-VL model directory")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |logit difference| allowed")
    p.add_argument("--seed", type=int, default=0)
    return p


@command(PROG)
def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    args.model = str(model_dir(args.model, "--model"))  # a URI: this host's copy
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise UsageError(
            f"needs torch and transformers (the reference implementation): {e}; install them with "
            f"pip install -e '.[test]'"
        ) from None

    try:
        result = compare(args.model, args.seed)
    except (FileNotFoundError, ValueError, KeyError, OSError) as e:
        raise UsageError(f"--model {args.model}: cannot be read: {e}") from None
    ok = result["max_abs_logit_diff"] <= args.tolerance
    print(
        json.dumps(
            {
                "max_abs_logit_diff": result["max_abs_logit_diff"],
                "tolerance": args.tolerance,
                "ok": ok,
                "logit_std": result["logit_std"],
                "num_tokens": result["num_tokens"],
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
