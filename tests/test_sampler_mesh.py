"""The tree sampler under a 4-device CPU mesh (batch split over ('data', 'fsdp')) samples the same trees as on
one device. Runs in a subprocess (the device count must be set before JAX starts); slow: two compilations."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    from support import EOS, IMAGE, VIDEO
    from support.sampler_models import random_step, tiny_config, tiny_params
    from support.trees import assert_trees_close, assert_trees_equal
    from ipl_jax.model import param_shapes
    from ipl_jax.model.sharding import make_mesh, param_shardings, shard_params
    from ipl_jax.sampling.config import SamplerConfig
    from ipl_jax.sampling.prompts import pack_tree_prompts
    from ipl_jax.sampling.tree_sampler import sample_tree

    assert len(jax.devices()) == 4
    cfg = tiny_config()
    params = tiny_params(cfg)
    rng = np.random.default_rng(0)
    steps = [random_step(rng, cfg, uid=i, n_text=3 + 2 * i) for i in range(4)]
    config = SamplerConfig(branching=(2, 2, 1, 1), max_turn_tokens=(5, 4, 3, 3), eos_ids=(EOS,),
                           suppress_ids=(IMAGE, VIDEO), prefix_buckets=(32,), prompt_buckets=(16,),
                           patch_buckets=(64,))
    prompts = pack_tree_prompts(cfg, steps, config, seed=3)
    single = jax.device_get(sample_tree(params, cfg, prompts, config))
    mesh = make_mesh((2, 2, 1))
    sharded_params = shard_params(params, param_shardings(params, mesh))
    tree = sample_tree(sharded_params, cfg, prompts, config, mesh)
    assert len(tree.tokens[2].sharding.device_set) == 4, tree.tokens[2].sharding
    tree = jax.device_get(tree)
    assert_trees_equal(tree.replace(logps=None), single.replace(logps=None))
    assert_trees_close(tree.logps, single.logps, rtol=1e-7, atol=1e-4)
    print("MESH-OK")
""")


@pytest.mark.slow
def test_sharded_sampling_equals_single_device():
    root = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "MESH-OK" in out.stdout, out.stderr[-4000:]
