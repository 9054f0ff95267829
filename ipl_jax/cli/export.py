"""``ipl-jax export``: a training checkpoint, an Orbax params tree or a Hugging Face directory as a Hugging Face
directory (weights in safetensors, the base model's tokenizer and processor files copied)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import jax

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import param_shapes
from ipl_jax.model.weights import load_params, save_params


# Files of a Hugging Face model directory that travel with the weights on export.
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
               "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
               "preprocessor_config.json")


def main(argv: list[str]) -> int:
    """``ipl-jax export``: a training checkpoint, an Orbax params tree or a HF directory -> a HF directory."""
    ap = argparse.ArgumentParser(prog="ipl-jax export", description=main.__doc__.splitlines()[0])
    ap.add_argument("--base-model", required=True,
                    help="HF directory whose config.json describes the model; its tokenizer and processor files "
                         "are copied to the output")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None,
                     help="training checkpoint directory written by ipl-jax (TrainState; LoRA adapters are merged)")
    src.add_argument("--params", default=None, help="Orbax checkpoint directory holding a bare params tree")
    ap.add_argument("--step", type=int, default=None, help="with --checkpoint: the step (default: the latest)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16", "float16"])
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.base_model, "config.json")):
        print(f"ipl-jax export: {args.base_model}: no config.json", file=sys.stderr)
        return 2
    cfg = Qwen2VLConfig.from_dir(args.base_model)
    if args.checkpoint is not None:
        from ipl_jax.training.checkpoint import Checkpointer

        if not os.path.isdir(args.checkpoint):
            print(f"ipl-jax export: {args.checkpoint}: no such checkpoint directory", file=sys.stderr)
            return 2
        ckpt = Checkpointer(os.path.abspath(args.checkpoint))
        try:
            params, _ = ckpt.load_model_params(args.step)
        finally:
            ckpt.close()
    elif args.params is not None:
        import orbax.checkpoint as ocp

        target = param_shapes(cfg)
        with ocp.StandardCheckpointer() as ckptr:
            params = ckptr.restore(os.path.abspath(args.params), target)
    else:
        params, cfg = load_params(args.base_model)
    if args.dtype:
        params = jax.tree.map(lambda a: a.astype(args.dtype), params)
    save_params(params, cfg, args.out)
    copied = []
    for name in _SIDE_FILES:
        f = os.path.join(args.base_model, name)
        if os.path.isfile(f) and os.path.abspath(f) != os.path.abspath(os.path.join(args.out, name)):
            shutil.copyfile(f, os.path.join(args.out, name))
            copied.append(name)
    print(json.dumps({"out": args.out, "copied": copied}), file=sys.stdout)
    return 0
