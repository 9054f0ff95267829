"""A tiny random Qwen2-VL for the sampler tests (init_params, std 0.3, end-of-turn logit boosted) and random step
prompts."""

from __future__ import annotations

import numpy as np

from support import EOS, FIRST_TEXT_ID, IMAGE, VIDEO, VISION_END, VISION_START

VOCAB = 96


def tiny_config():
    from ipl_jax.model.sizes import Size, SpecialIds, small_config

    ids = SpecialIds(IMAGE, VIDEO, VISION_START, VISION_END, EOS)
    return small_config(
        Size(64, 2, 4, 2, 128, VOCAB, 32, 1, 2, mlp_ratio=2), ids=ids, rms_norm_eps=1e-6, rope_theta=1e4
    )


def tiny_params(cfg, seed: int = 0, std: float = 0.3, eos_boost: float = 3.0):
    """Random weights with std ``std`` (far from uniform logits) and the end-of-turn logit scaled by
    ``eos_boost`` so that turns end at varied lengths."""
    import jax

    from ipl_jax import model as M

    params = M.init_params(cfg, jax.random.PRNGKey(seed), std=std)
    k = params["lm_head"]["kernel"]
    params["lm_head"]["kernel"] = k.at[:, EOS].multiply(eos_boost)
    return params


def random_step(rng: np.random.Generator, cfg, uid: int, n_text: int, prompt_lens=(7, 3, 4), grid=(1, 4, 4)):
    """StepPrompts with a random image (grid t x h x w patches) and random text tokens."""
    from ipl_jax.sampling.prompts import StepPrompts

    t, h, w = grid
    pv = rng.standard_normal((t * h * w, cfg.vision.patch_dim)).astype(np.float32)
    n_img = t * h * w // cfg.vision.merge_factor
    text = lambda n: list(rng.integers(FIRST_TEXT_ID, VOCAB, n))
    prefix = np.asarray(text(3) + [VISION_START] + [IMAGE] * n_img + [VISION_END] + text(n_text), np.int32)
    turns = tuple(np.asarray(text(k), np.int32) for k in prompt_lens)
    return StepPrompts(
        prefix_ids=prefix, turn_prompt_ids=turns, pixel_values=pv, image_grid_thw=np.asarray([grid], np.int64), uid=uid
    )
