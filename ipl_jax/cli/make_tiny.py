"""``ipl-jax make-tiny --out DIR``: a random tiny Qwen2-VL (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) checkpoint with a
small BPE tokenizer, written with transformers (needs torch), for tests and smoke runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ipl_jax.cli.common import CommandParser, command, nonnegative_int, positive_int
from ipl_jax.data.tiny import ARCHS, DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, DEFAULT_VOCAB_SIZE, make_tiny_checkpoint
from ipl_jax.data.tiny_tokenizer import MissingDependency
from ipl_jax.pipeline.paths import UsageError, input_file, output_dir

PROG = "ipl-jax make-tiny"


def parser() -> CommandParser:

    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--model-config",
        dest="model_config",
        default=None,
        help="model overrides: a JSON object or a JSON file (nested or flat Hugging Face layout)",
    )
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--scale", type=float, default=None, help="multiply every Linear/Embedding weight by this")
    p.add_argument("--vocab-size", type=positive_int, default=DEFAULT_VOCAB_SIZE)
    p.add_argument("--corpus", help="text file, one tokenizer training text per line (default: built-in)")
    p.add_argument("--min-pixels", type=positive_int, default=DEFAULT_MIN_PIXELS)
    p.add_argument("--max-pixels", type=positive_int, default=DEFAULT_MAX_PIXELS)
    p.add_argument("--zero-biases", action="store_true", help="keep transformers' zero biases / unit norms")
    for flag, key in (
        ("--hidden-size", "hidden_size"),
        ("--intermediate-size", "intermediate_size"),
        ("--layers", "num_hidden_layers"),
        ("--heads", "num_attention_heads"),
        ("--kv-heads", "num_key_value_heads"),
    ):
        p.add_argument(flag, type=positive_int, dest=key, default=None, help=f"text {key}")
    p.add_argument("--vision-depth", type=positive_int, default=None)
    p.add_argument(
        "--vision-dim", type=positive_int, default=None, help="vision width (embed_dim; 2.5, 3: hidden_size)"
    )
    p.add_argument("--vision-heads", type=positive_int, default=None)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument(
        "--arch",
        choices=ARCHS,
        default="qwen2_vl",
        help="Qwen2-VL, Qwen2.5-VL (windowed ViT), Qwen3-VL (DeepStack) or Qwen3-VL-MoE (4 experts, top 2)",
    )
    return p


def read_json_arg(value: str, flag: str = "--model-config") -> dict:
    """A JSON object given inline or as a file."""
    text = value
    if not value.lstrip().startswith("{"):
        text = input_file(value, flag, "a JSON object or a JSON file").read_text(encoding="utf-8")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag}: neither a JSON object nor a JSON file ({e})") from None
    if not isinstance(d, dict):
        raise UsageError(f"{flag}: must be a JSON object, got {type(d).__name__}")
    return d


def model_overrides(args) -> dict:
    """The model config overrides of ``--model-config`` and the size flags (flags win)."""
    overrides = read_json_arg(args.model_config) if args.model_config else {}
    text_over = dict(overrides.pop("text_config", None) or {})
    vision_over = dict(overrides.pop("vision_config", None) or {})
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        if getattr(args, key) is not None:
            text_over[key] = getattr(args, key)
    vision_width = "embed_dim" if args.arch == "qwen2_vl" else "hidden_size"
    for flag, key in (("vision_depth", "depth"), ("vision_dim", vision_width), ("vision_heads", "num_heads")):
        if getattr(args, flag) is not None:
            vision_over[key] = getattr(args, flag)
    if args.tie_embeddings:
        overrides["tie_word_embeddings"] = True
    overrides.update({"text_config": text_over, "vision_config": vision_over})
    return overrides


@command(PROG)
def main(argv: list[str]) -> int:

    args = parser().parse_args(argv)
    output_dir(args.out, "--out")
    overrides = model_overrides(args)
    corpus = None
    if args.corpus:
        text = input_file(args.corpus, "--corpus", "a text file").read_text(encoding="utf-8")
        corpus = [ln for ln in text.splitlines() if ln.strip()]
    try:
        out = make_tiny_checkpoint(
            args.out,
            overrides,
            vocab_size=args.vocab_size,
            corpus=corpus,
            seed=args.seed,
            scale=args.scale,
            min_pixels=args.min_pixels,
            max_pixels=args.max_pixels,
            random_biases=not args.zero_biases,
            arch=args.arch,
        )
    except (MissingDependency, ValueError) as e:
        raise UsageError(str(e)) from None
    cfg = json.loads((Path(out) / "config.json").read_text())
    t = cfg.get("text_config", cfg)
    print(
        f"wrote {out}: vocab {t['vocab_size']}, hidden {t['hidden_size']}, layers {t['num_hidden_layers']}, "
        f"image_token_id {cfg['image_token_id']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
