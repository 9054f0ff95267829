"""``ipl-jax export``: a training checkpoint (Orbax), an Orbax params tree or a Hugging Face model directory as a
Hugging Face directory (weights in safetensors, the base model's tokenizer and processor files copied).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import jax
import orbax.checkpoint as ocp

from ipl_jax import storage
from ipl_jax.cli.common import CommandParser, command, nonnegative_int
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import param_shapes
from ipl_jax.model.weights import load_params, save_params
from ipl_jax.pipeline.paths import UsageError, input_dir, model_dir, output_dir
from ipl_jax.training.checkpoint import Checkpointer

PROG = "ipl-jax export"

# Files of a Hugging Face model directory that travel with the weights on export.
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
)


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="Hugging Face model directory whose config.json describes the model; its tokenizer and "
        "processor files are copied to the output (its weights are exported when no Orbax "
        "source is given)",
    )
    p.add_argument(
        "--orbax-checkpoint",
        dest="orbax_checkpoint",
        default=None,
        help="training checkpoint directory written by ipl-jax (Orbax TrainState; LoRA adapters are merged)",
    )
    p.add_argument(
        "--orbax-params",
        dest="orbax_params",
        default=None,
        help="Orbax checkpoint directory holding a bare params tree",
    )
    p.add_argument(
        "--step", type=nonnegative_int, default=None, help="with --orbax-checkpoint: the step (default: the latest)"
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    return p


def same_file(model: str, out: str, name: str) -> bool:
    """Whether ``model/name`` and ``out/name`` are one file (an export into its own model directory)."""
    return storage.absolute(os.path.join(model, name)) == storage.absolute(os.path.join(out, name))


@command(PROG)
def main(argv: list[str]) -> int:

    p = parser()
    args = p.parse_args(argv)
    if args.orbax_checkpoint is not None and args.orbax_params is not None:
        p.error("give one of --orbax-checkpoint and --orbax-params")
    output_dir(args.out, "--out", remote=True)
    source = args.model
    if args.orbax_checkpoint is None and args.orbax_params is None:
        args.model = str(model_dir(args.model, "--model"))  # its weights are the ones exported (a URI: a copy)
    elif not os.path.isfile(os.path.join(model := input_dir(args.model, "--model"), "config.json")):
        raise UsageError(f"--model {args.model}: no config.json; expected a Hugging Face model directory")
    else:
        args.model = str(model)
    cfg = Qwen2VLConfig.from_dir(args.model)
    if args.orbax_checkpoint is not None:  # Orbax reads a URI itself
        input_dir(args.orbax_checkpoint, "--orbax-checkpoint", "a training checkpoint directory", fetch=False)
        ckpt = Checkpointer(storage.absolute(args.orbax_checkpoint))
        try:
            params, _ = ckpt.load_model_params(args.step)
        finally:
            ckpt.close()
    elif args.orbax_params is not None:
        input_dir(args.orbax_params, "--orbax-params", "an Orbax params directory", fetch=False)
        with ocp.StandardCheckpointer() as ckptr:
            params = ckptr.restore(storage.absolute(args.orbax_params), param_shapes(cfg))
    else:
        params, cfg = load_params(args.model)
    if args.dtype:
        params = jax.tree.map(lambda a: a.astype(args.dtype), params)
    copied = []
    with storage.staged_dir(args.out) as out:  # a URI: written here, then uploaded
        save_params(params, cfg, out)
        for name in SIDE_FILES:
            f = os.path.join(args.model, name)
            if os.path.isfile(f) and not same_file(source, args.out, name):
                shutil.copyfile(f, os.path.join(out, name))
                copied.append(name)
    print(json.dumps({"out": args.out, "copied": copied}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
