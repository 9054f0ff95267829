"""Packed T-DPO rounds of one fixed shape on the small model, shared by the T-DPO tests and their 8-device mesh
subprocess."""

import dataclasses

import jax
import numpy as np

from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.preference import tdpo as ipl
from support.small_models import make_groups, tiny_cfg, tiny_params

# one shape for every packed batch of these tests, so that tests share compilations
ROUND_PACKING = PB.PackingConfig(rows=4, max_continuations=4, max_pairs=6, text_buckets=(64,), patch_buckets=(32,))
ROUND_TDPO = dict(optimizer_settings=dataclasses.replace(ipl.IPL_OPTIMIZER, learning_rate=3e-3), logp_chunk=16)


def round_batches(cfg, seed):
    """Two batches of the same shapes: 8 groups with 2..4 continuations, 12 pairs (4 rows and 6 pairs each)."""
    groups = make_groups(cfg, seed=seed, n_groups=8, conts=(3, 2, 4, 2), scored_groups=(5,))
    pairs = []
    for g, group in enumerate(groups):
        pairs.append(PB.PairRef(g, 0, 1, 1 + g % 4))
        if len(group.continuations) > 2 and g % 2 == 0:
            pairs.append(PB.PairRef(g, 2, 0, 3))
    batches = PK.pack_round(cfg, groups, pairs, ROUND_PACKING)
    assert len(batches) == 2 and all(b.input_ids.shape == (4, 64) for b in batches)
    return groups, pairs, batches


# the paper's IPL learning rates are 1e-6..1e-7. (Adam turns float-rounding differences of near-zero gradients
# into full-size steps, so a much larger rate would compare rounding noise, not the sharding.)
MESH_TDPO = dict(optimizer_settings=dataclasses.replace(ipl.IPL_OPTIMIZER, learning_rate=1e-5), logp_chunk=16)


def mesh_round(mesh):
    """train_round on round_batches(seed=12): (per-step losses, sharding spec of an MLP kernel, that kernel)."""
    cfg = tiny_cfg()
    config = ipl.TDPOConfig(model=cfg, **MESH_TDPO)
    _, _, batches = round_batches(cfg, seed=12)
    state = ipl.init_state(tiny_params(cfg, 0), config, jax.random.PRNGKey(0))
    state, m = ipl.train_round(
        state, tiny_params(cfg, 0), ipl.RoundData(batches), jax.random.PRNGKey(5), config, mesh=mesh
    )
    leaf = state.params["model"]["layers"]["mlp"]["up_proj"]["kernel"]
    return [s["loss"] for s in m["per_step"]], str(getattr(leaf.sharding, "spec", "")), np.asarray(leaf)
