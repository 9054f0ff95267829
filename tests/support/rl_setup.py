"""A tiny random policy for the RL and online-evaluation tests: a BPE tokenizer trained on the synthetic world's
texts, a 2-layer Qwen2-VL whose ids match it, screenshots seen at 56x112 (8 image tokens), and golden steps from
the synthetic world."""

from __future__ import annotations

import jax

TURN_TOKENS = (6, 6, 5, 8)
MIN_PIXELS = MAX_PIXELS = 56 * 112


def make_tokenizer(directory):
    from pathlib import Path

    from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer, write_tokenizer
    from ipl_jax.data.tokenizer import load_tokenizer

    directory = Path(directory)
    write_tokenizer(train_tokenizer(default_corpus(n_lines=300), 600), directory)
    return load_tokenizer(directory)


def make_config(tokenizer):
    """The model config: width 64, 2 layers, a 1-block ViT, the tokenizer's ids."""
    from ipl_jax.data.tiny import build_config_dict
    from ipl_jax.data.tokenizer import SPECIAL_TOKENS
    from ipl_jax.model.config import Qwen2VLConfig

    vocab = tokenizer.hf.get_vocab()
    special = {s: vocab[s] for s in SPECIAL_TOKENS}
    return Qwen2VLConfig.from_hf_dict(build_config_dict({"vision_config": {"depth": 1}}, len(tokenizer), special))


def make_model(tokenizer, seed: int = 0):
    """(cfg, params): ``make_config`` with ``init_params`` weights (std 0.3: varied tokens)."""
    from ipl_jax.model import init_params

    cfg = make_config(tokenizer)
    return cfg, init_params(cfg, jax.random.PRNGKey(seed), std=0.3)


def image_config():
    from ipl_jax.data.image_processing import ImageProcessorConfig

    return ImageProcessorConfig(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


def sampler_config(tokenizer, branching=(1, 1, 1, 1), temperature=1.0):
    from ipl_jax.sampling.config import SamplerConfig

    return SamplerConfig.for_tokenizer(
        tokenizer,
        branching=branching,
        max_turn_tokens=TURN_TOKENS,
        temperature=temperature,
        prefix_buckets=(96, 128, 256),
        prompt_buckets=(64, 96),
        patch_buckets=(256, 512),
    )


def golden_steps(n_episodes: int = 2, seed: int = 0):
    from ipl_jax.envs.synthetic.dataset import generate_split

    return [s for e in generate_split("train", n_episodes, seed=seed) for s in e.steps]
