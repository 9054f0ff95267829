"""The sampler benchmark's inputs (``python -m tools.bench_sampler_gpu``): the model at each ``--size``, random
steps of one screenshot, and the job's sampler settings with exact buckets; shared with its transformers worker."""

from __future__ import annotations

import numpy as np

from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.prompts import StepPrompts
from tools.bench_models import bench_model
from tools.bench_tree import random_steps

# per size: screenshot (width x height), pixel limit (the paper's 1280x720 on AMEX / AndroidControl; AITZ's
# 1540x1540 is --max-pixels 2371600), turn budgets, text around the image, turn-2..4 prompts (the CoaT template's)
DEFAULTS = {
    "2b": dict(screen="1080x2400", max_pixels=1280 * 720, turns="256,128,32,32", text="20,17", prompts="64,50,25"),
    "tiny": dict(screen="112x224", max_pixels=1280 * 720, turns="6,5,4,4", text="5,6", prompts="7,5,4"),
}


def model_config(size: str, dtype: str, attention: str) -> Qwen2VLConfig:
    """The real Qwen2-VL-2B architecture or the tiny test model, computing and storing weights in ``dtype``."""
    if size == "2b":
        from ipl_jax.planning.shapes import ARCHITECTURES

        cfg = Qwen2VLConfig.from_hf_dict(ARCHITECTURES["qwen2-vl-2b"])
    else:
        cfg = bench_model("tiny")
    return cfg.replace(dtype=dtype, param_dtype=dtype, attention=attention)


def make_steps(cfg: Qwen2VLConfig, n: int, screen, max_pixels: int, text, prompts, seed: int):
    """(n random steps, their grid): one screenshot grid (the processor's resize of ``screen`` (width, height)
    under ``max_pixels``), ``text`` (before, after) tokens around the image, turn-2..4 ``prompts`` lengths."""
    grid = ImageProcessorConfig(max_pixels=max_pixels).grid_for(screen[1], screen[0])
    shape = dict(grid=grid, text_before=text[0], text_after=text[1], prompts=prompts)
    return random_steps(cfg, shape, n, np.random.default_rng(seed)), grid


def sampler_config(cfg: Qwen2VLConfig, steps: list[StepPrompts], branching, turns) -> SamplerConfig:
    """The job's sampler settings with exact buckets and an end id outside the vocabulary (every turn runs its
    full budget, so every method makes the same number of tokens)."""
    patches = steps[0].pixel_values.shape[0]
    return SamplerConfig(
        branching=branching,
        max_turn_tokens=turns,
        temperature=(1.0, 1.0, 1.0, 0.0),
        eos_ids=(cfg.text.vocab_size,),
        suppress_ids=(cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id),
        prefix_buckets=(len(steps[0].prefix_ids),),
        prompt_buckets=tuple(sorted({len(p) for p in steps[0].turn_prompt_ids})),
        patch_buckets=(len(steps) * patches,),
        image_patches=patches,
    )
