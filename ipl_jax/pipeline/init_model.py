"""Random checkpoints of the published Qwen2-VL architectures (``ipl-jax init-model``): real shapes, our tokenizer
(specials at the config's ids), nothing downloaded; weights written tensor by tensor.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jax

from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer, write_tokenizer
from ipl_jax.data.tokenizer import SPECIAL_TOKENS
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import count_params, param_shapes
from ipl_jax.model.random_weights import hf_tensor_shapes, write_random_weights
from ipl_jax.planning.shapes import ARCHITECTURES

DEFAULT_BPE_SIZE = 8192  # the most BPE pieces learnt from the corpus (the rest of the vocabulary is filler)
DTYPES = ("bfloat16", "float32", "float16")
# config.json key of each special token the model reads
_CONFIG_IDS = {
    "bos_token_id": "<|endoftext|>",
    "eos_token_id": "<|im_end|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
}


def checkpoint_config(name: str, overrides: dict | None = None, dtype: str = "bfloat16") -> dict:
    """The ``config.json`` dict of architecture ``name`` with ``overrides`` merged key by key (the merger output
    follows the text ``hidden_size``). ValueError for a bad architecture or an inconsistent override."""

    if name not in ARCHITECTURES:
        raise ValueError(f"--architecture {name!r} is unknown (valid: {', '.join(ARCHITECTURES)})")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is unknown (valid: {', '.join(DTYPES)})")
    d = copy.deepcopy(ARCHITECTURES[name])
    text = d.get("text_config", d)  # the nested layout (Qwen3-VL) or the flat one
    over = copy.deepcopy(overrides or {})
    for nested in ("vision_config", "text_config", "rope_scaling"):
        part = over.pop(nested, None)
        if part is None:
            continue
        home = d if nested in d else text
        if not isinstance(part, dict) or nested not in home:
            raise ValueError(f"override {nested}: expected a JSON object (of a part {name} has)")
        home[nested].update(part)
    d.update(over)
    merger = "out_hidden_size" if "out_hidden_size" in d["vision_config"] else "hidden_size"
    d["vision_config"][merger] = text["hidden_size"]
    d["torch_dtype"] = dtype
    Qwen2VLConfig.from_hf_dict(d)  # raises ValueError naming an inconsistent field
    return d


def tensor_shapes(hf_config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(safetensors name, shape) of every tensor ``write_random_checkpoint`` writes for ``hf_config``."""

    return hf_tensor_shapes(Qwen2VLConfig.from_hf_dict(hf_config))


def _write_tokenizer(out: Path, hf_config: dict, bpe_size: int) -> dict[str, int]:
    """Our tokenizer in ``out``, specials at the config's ids when the vocabulary holds them; returns the ids."""

    first, n = int(hf_config["bos_token_id"]), len(SPECIAL_TOKENS)
    vocab = int(hf_config.get("text_config", hf_config)["vocab_size"])
    if first + n <= vocab:  # the published layout: BPE (filled) below the specials at the config's ids
        tok = train_tokenizer(default_corpus(), min(bpe_size, first) + n, specials_at=first)
    else:
        tok = train_tokenizer(default_corpus(), min(bpe_size + n, vocab))
    return write_tokenizer(tok, out)


def write_random_checkpoint(
    out: str | Path,
    hf_config: dict,
    seed: int = 0,
    bpe_size: int = DEFAULT_BPE_SIZE,
    max_shard_bytes: int = 4 << 30,
) -> dict:
    """Write the checkpoint directory into ``out``; returns a summary (parameters, bytes, files, special ids)."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = _write_tokenizer(out, hf_config, bpe_size)
    config = copy.deepcopy(hf_config)
    for key, token in _CONFIG_IDS.items():
        config[key] = ids[token]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    cfg = Qwen2VLConfig.from_hf_dict(config)
    ImageProcessorConfig.for_model(cfg).save(out)
    nbytes = write_random_weights(
        str(out),
        cfg,
        jax.random.PRNGKey(seed),
        dtype=config["torch_dtype"],
        std=float(config.get("initializer_range", 0.02)),
        max_shard_bytes=max_shard_bytes,
    )
    files = sorted(p.name for p in out.glob("*.safetensors"))
    return {
        "out": str(out),
        "parameters": count_params(param_shapes(cfg)),
        "bytes": nbytes,
        "files": files,
        "tokenizer_size": max(ids.values()) + 1,
        "special_ids": {k: config[k] for k in _CONFIG_IDS},
    }
