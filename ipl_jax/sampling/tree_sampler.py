"""The fixed-shape, prefix-sharing CoaT-tree sampler (docs/method.md §3): one prefill per step, then per turn a
prompt extension, a fan-out of each node's cache to its children and the turn's sampling; rows are row-major.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from ipl_jax import distributed
from ipl_jax.coat.tree import NUM_TURNS, CoaTTree, num_nodes
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.decode import grow_cache
from ipl_jax.model.sharding import batch_spec, inputs_shardings
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.decoding import (
    constrain_rows,
    extend_prompt,
    fan_out,
    last_tokens,
    prefill_context,
    sample_config_turn,
)
from ipl_jax.sampling.keys import node_keys
from ipl_jax.sampling.prompts import TreePrompts


def _sample_tree(
    params: dict,
    cfg: Qwen2VLConfig,
    prompts: TreePrompts,
    temperature: jax.Array,
    config: SamplerConfig,
    mesh: jax.sharding.Mesh | None,
) -> CoaTTree:
    br = config.branching
    b = prompts.step_index.shape[0]
    prefix_len = prompts.prefix.input_ids.shape[1]
    prompt_lens = [p.shape[1] for p in prompts.turn_prompt_ids]
    sizes = [config.cache_size(prefix_len, prompt_lens, upto_turn=t) for t in range(1, NUM_TURNS + 1)]

    cache, feed = prefill_context(params, cfg, prompts.prefix, sizes[0])
    tokens, lengths, logps, finished = [], [], [], []
    pending = pending_valid = None
    for t in range(1, NUM_TURNS + 1):
        parents = num_nodes(br, t - 1)
        if t > 1:  # teacher-force the turn-t prompt once per parent node, then copy to the children
            ids = jnp.repeat(jnp.asarray(prompts.turn_prompt_ids[t - 2]), parents, axis=0)
            lens = jnp.repeat(jnp.asarray(prompts.turn_prompt_lengths)[:, t - 2], parents, axis=0)
            cache = constrain_rows(grow_cache(cache, sizes[t - 1]), mesh, cfg)
            cache, feed = extend_prompt(params, cfg, cache, pending, pending_valid, ids, lens)
        cache, feed = fan_out(cache, feed, br[t - 1], sizes[t - 1])
        cache = constrain_rows(cache, mesh, cfg)
        keys = node_keys(jnp.asarray(prompts.step_keys), br, t).reshape(-1, 2)
        tok, n, lp, fin, cache, pending_valid = sample_config_turn(
            params, cfg, cache, feed, keys, config.max_turn_tokens[t - 1], temperature[t - 1], config
        )
        pending = last_tokens(tok, n, config.pad_id)
        shape = (b,) + br[:t]
        tokens.append(tok.reshape(shape + (-1,)))
        lengths.append(n.reshape(shape))
        logps.append(lp.reshape(shape + (-1,)))
        finished.append(fin.reshape(shape))
    return CoaTTree(
        tokens=tuple(tokens),
        lengths=tuple(lengths),
        logps=tuple(logps),
        finished=tuple(finished),
        step_index=jnp.asarray(prompts.step_index, jnp.int32),
        step_valid=jnp.asarray(prompts.step_valid, bool),
    )


sample_tree_jit = jax.jit(_sample_tree, static_argnums=(1, 4, 5))


def prompt_vision_rows(batch_size: int, mesh: jax.sharding.Mesh | None, config: SamplerConfig, devices=None):
    """The sorted sampler rows whose image slots ``devices`` (default: this process's) hold under ``mesh``, or None
    when they hold every row or the packed-patch layout is used."""
    if not config.image_patches:
        return None
    return distributed.batch_rows(batch_size, mesh, devices)


def prefix_shardings(prompts: TreePrompts, mesh: jax.sharding.Mesh):
    """The shardings of ``prompts.prefix`` once global (``inputs_shardings``), also for partial ``vision_rows``."""
    prefix = prompts.prefix
    if prompts.vision_rows is not None:
        n, b = len(prompts.vision_rows), prompts.batch_size
        whole = lambda x: jax.ShapeDtypeStruct((x.shape[0] // n * b, *x.shape[1:]), x.dtype)
        prefix = prefix.replace(vision=jax.tree.map(whole, prefix.vision))
    return inputs_shardings(prefix, mesh)


def place_prompts(prompts: TreePrompts, mesh: jax.sharding.Mesh | None) -> TreePrompts:
    """Device-put a prompt batch with rows over ('data', 'fsdp') when they divide; image slots of this process's rows
    become global arrays. Without a mesh, unchanged."""
    if mesh is None:
        if prompts.vision_rows is not None:
            raise ValueError("place_prompts: prompts with the image slots of some rows only need a mesh")
        return prompts

    def rows(a, axis=0):
        return jax.device_put(a, NamedSharding(mesh, batch_spec(mesh, np.shape(a), axis)))

    sh = prefix_shardings(prompts, mesh)
    if prompts.vision_rows is None:
        prefix = jax.tree.map(jax.device_put, prompts.prefix, sh)
    else:
        vision = prompts.prefix.vision
        held = np.asarray(prompts.vision_rows, np.int64)
        axes = jax.tree.map(lambda _: 0, vision)
        text = jax.tree.map(jax.device_put, prompts.prefix.replace(vision=None), sh.replace(vision=None))
        prefix = text.replace(vision=distributed.from_local_rows(vision, sh.vision, axes, held, prompts.batch_size))
    return TreePrompts(
        prefix=prefix,
        turn_prompt_ids=tuple(rows(p) for p in prompts.turn_prompt_ids),
        turn_prompt_lengths=rows(prompts.turn_prompt_lengths),
        step_keys=rows(prompts.step_keys),
        step_index=rows(prompts.step_index),
        step_valid=rows(prompts.step_valid),
    )


def sample_tree(
    params: dict, cfg: Qwen2VLConfig, prompts: TreePrompts, config: SamplerConfig, mesh: jax.sharding.Mesh | None = None
) -> CoaTTree:
    """Samples B CoaT-trees with prefix sharing; returns a ``CoaTTree``. One compilation per config (up to
    temperatures) and bucket shapes; ``mesh`` splits rows over ('data', 'fsdp').
    """
    temperature = jnp.asarray(config.temperature, jnp.float32)
    return sample_tree_jit(params, cfg, place_prompts(prompts, mesh), temperature, config.compile_key(), mesh)
