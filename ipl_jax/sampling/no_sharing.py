"""The no-sharing baseline: every tree node decoded from scratch with the prefix-sharing sampler's keys (same
tree for equal logits); for the benchmark and the equivalence test.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.coat.tree import NUM_TURNS, CoaTTree, flatten_node_index, num_nodes, unflatten_node_index
from ipl_jax.model import VisionInputs, encode_images, extend, init_cache
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.decode import last_valid_index
from ipl_jax.model.inputs import get_rope_index, prepare_vision
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.decoding import sample_config_turn
from ipl_jax.sampling.keys import node_keys, step_keys
from ipl_jax.sampling.prompts import StepPrompts


@functools.partial(jax.jit, static_argnums=(1, 7, 8))
def _scratch_level(
    params,
    cfg: Qwen2VLConfig,
    ids,
    mask,
    positions,
    vision_rows: VisionInputs,
    gather,
    config: SamplerConfig,
    level: int,
    keys,
    temperature,
):
    """Prefill each row's context (its own image encoding) into a fresh cache, then sample the level's turn.
    ids/mask: [R, L]; positions: int32[3, R, L]; gather: int32[n_img] feature rows in image-token order."""
    r, length = ids.shape
    budget = config.max_turn_tokens[level - 1]
    feats = jax.lax.map(lambda v: encode_images(params, cfg, v), vision_rows)  # [R, Nb, hidden]
    feats = feats.reshape(-1, feats.shape[-1])[gather]
    last = last_valid_index(mask)
    feed = jnp.take_along_axis(ids, last[:, None], axis=1)[:, 0]
    head = mask & (jnp.arange(length)[None, :] != last[:, None])
    cache = init_cache(cfg, r, length + budget)
    _, cache = extend(params, cfg, cache, ids, head, positions=positions, image_features=feats)
    tok, n, lp, fin, _, _ = sample_config_turn(params, cfg, cache, feed, keys, budget, temperature, config)
    return tok, n, lp, fin


def _pack_level(
    cfg: Qwen2VLConfig, contexts: list[np.ndarray], images: list[StepPrompts], config: SamplerConfig, length: int
):
    """Host packing of one level's contexts to ``length``: ids, mask, positions, per-row vision, gather order."""
    r = len(contexts)
    if max(len(c) for c in contexts) > length:
        raise ValueError(f"no-sharing context of {max(len(c) for c in contexts)} tokens exceeds its bound {length}")
    ids = np.full((r, length), config.pad_id, np.int32)
    mask = np.zeros((r, length), bool)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = c
        mask[i, : len(c)] = True
    grids = np.concatenate([s.image_grid_thw.reshape(-1, 3) for s in images])
    positions, _ = get_rope_index(ids, mask, grids, cfg)
    m = cfg.vision.merge_factor
    n_patches = max(s.pixel_values.shape[0] for s in images)
    bucket = int(math.ceil(n_patches / m) * m)
    rows = [prepare_vision(cfg, s.pixel_values, s.image_grid_thw, (bucket,)) for s in images]
    vision = jax.tree.map(lambda *a: np.stack(a), *rows)
    per_row = bucket // m
    gather = np.concatenate([i * per_row + np.arange(s.pixel_values.shape[0] // m) for i, s in enumerate(images)])
    return ids, mask, positions, vision, gather.astype(np.int32)


def sample_tree_no_sharing(
    params: dict,
    cfg: Qwen2VLConfig,
    items: Sequence[StepPrompts],
    config: SamplerConfig,
    seed,
    step_index: Sequence[int] | None = None,
    batch_size: int | None = None,
) -> CoaTTree:
    """The tree ``sample_tree`` would sample on the same prompts, computed without prefix sharing."""
    items = list(items)
    if not items:
        raise ValueError("sample_tree_no_sharing: no steps")
    n = len(items)
    b = n if batch_size is None else int(batch_size)
    rows = items + [items[-1]] * (b - n)
    index = list(range(n)) if step_index is None else [int(i) for i in step_index]
    index = index + [index[-1]] * (b - n)
    keys = jnp.asarray(step_keys(seed, [s.uid for s in rows]))
    br = config.branching
    # the level-t context bound: prefix bucket + earlier turns' budgets + prompt buckets, as the sharing sampler
    prefix_len = config.prefix_bucket(max(len(s.prefix_ids) for s in rows))
    prompt_lens = [config.prompt_bucket(max(len(s.turn_prompt_ids[t]) for s in rows)) for t in range(3)]
    tokens, lengths, logps, finished = [], [], [], []
    for t in range(1, NUM_TURNS + 1):
        n_t = num_nodes(br, t)
        contexts, images = [], []
        for i, s in enumerate(rows):
            for node in range(n_t):
                path = unflatten_node_index(node, br, t)
                ctx = [np.asarray(s.prefix_ids)]
                for u in range(1, t):  # ancestors' turns and the prompts after them
                    anc = flatten_node_index(path[:u], br)
                    tok_u = tokens[u - 1].reshape(b, -1, tokens[u - 1].shape[-1])[i, anc]
                    len_u = lengths[u - 1].reshape(b, -1)[i, anc]
                    ctx += [tok_u[:len_u], np.asarray(s.turn_prompt_ids[u - 1])]
                contexts.append(np.concatenate(ctx).astype(np.int32))
                images.append(s)
        bound = prefix_len + sum(config.max_turn_tokens[u - 1] + prompt_lens[u - 1] for u in range(1, t))
        ids, mask, positions, vision, gather = _pack_level(cfg, contexts, images, config, bound)
        level_keys = node_keys(keys, br, t).reshape(-1, 2)
        tok, ln, lp, fin = _scratch_level(
            params,
            cfg,
            ids,
            mask,
            positions,
            vision,
            gather,
            config.compile_key(),
            t,
            level_keys,
            jnp.float32(config.temperature[t - 1]),
        )
        shape = (b,) + br[:t]
        tokens.append(np.asarray(tok).reshape(shape + (-1,)))
        lengths.append(np.asarray(ln).reshape(shape))
        logps.append(np.asarray(lp).reshape(shape + (-1,)))
        finished.append(np.asarray(fin).reshape(shape))
    return CoaTTree(
        tokens=tuple(jnp.asarray(x) for x in tokens),
        lengths=tuple(jnp.asarray(x) for x in lengths),
        logps=tuple(jnp.asarray(x) for x in logps),
        finished=tuple(jnp.asarray(x) for x in finished),
        step_index=jnp.asarray(index, jnp.int32),
        step_valid=jnp.asarray(np.arange(b) < n),
    )
