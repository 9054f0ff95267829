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


def assert_greedy_tree_is_greedy_decoding(params, cfg, steps, config, tree, ref_bucket: int, patch_bucket: int) -> int:
    """Every node of a temperature-0 ``tree`` (``sample_tree`` of ``steps`` under ``config``, numpy) is the greedy
    decoding of its step, computed with ``model.greedy_generate`` turn by turn on the concatenated dialogue (text
    bucket ``ref_bucket``, patch bucket ``patch_bucket`` per image); returns the tokens of every row's dialogue."""
    from ipl_jax import model as M
    from ipl_jax.coat.tree import NUM_TURNS

    ctx = [list(s.prefix_ids) for s in steps]
    budget = max(config.max_turn_tokens)
    pv = np.concatenate([s.pixel_values for s in steps])
    grids = np.concatenate([s.image_grid_thw for s in steps])
    for t in range(1, NUM_TURNS + 1):
        if t > 1:
            ctx = [c + list(s.turn_prompt_ids[t - 2]) for c, s in zip(ctx, steps)]
        buckets = dict(text_buckets=(ref_bucket,), patch_buckets=(patch_bucket * len(steps),))
        inputs = M.prepare_inputs(cfg, ctx, None, pv, grids, **buckets)
        out, n = M.greedy_generate(params, cfg, inputs, max_new_tokens=budget, eos_ids=config.eos_ids, pad_id=0)
        T = config.max_turn_tokens[t - 1]
        for row in range(len(steps)):
            ref = list(np.asarray(out[row, : min(int(n[row]), T)]))
            toks = tree.tokens[t - 1][row].reshape(-1, T)
            lens = tree.lengths[t - 1][row].reshape(-1)
            for node in range(toks.shape[0]):
                assert list(toks[node, : lens[node]]) == ref, (t, row, node)
            assert np.all(tree.finished[t - 1][row] == (ref[-1] in config.eos_ids))
            ctx[row] = ctx[row] + ref
    return sum(len(c) for c in ctx)
