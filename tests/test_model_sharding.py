"""The model's own forward and greedy decoding, run on parameters and inputs placed on an 8-device CPU mesh
(fsdp=4 x tensor=2), equal single-device results: sharding is placement, GSPMD propagates the rest.

The mesh needs XLA_FLAGS set before jax starts, so the check runs in a subprocess.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from support import fake_devices
from support.hf_models import save_tiny, two_image_batch

PATCH_DIM = 3 * 2 * 14 * 14

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax
    from jax.sharding import PartitionSpec as P
    from ipl_jax.model.decode import greedy_generate
    from ipl_jax.model.inputs import prepare_inputs
    from ipl_jax.model.params import param_shapes
    from ipl_jax.model.sharding import inputs_shardings, make_mesh, param_shardings, spec_for
    from ipl_jax.model.text import forward_inputs
    from ipl_jax.model.weights import load_params

    model_dir, batch_file = sys.argv[1], sys.argv[2]
    data = np.load(batch_file)
    assert len(jax.devices()) == 8
    jax.config.update("jax_default_matmul_precision", "highest")
    params, cfg = load_params(model_dir)
    inputs = prepare_inputs(cfg, data["ids"], data["mask"], data["pv"], data["grids"], text_buckets=(64,),
                            patch_buckets=(192,))
    single = np.asarray(forward_inputs(params, cfg, inputs))
    single_tokens = np.asarray(greedy_generate(params, cfg, inputs, max_new_tokens=6)[0])

    mesh = make_mesh((1, 4, 2))
    shardings = param_shardings(param_shapes(cfg), mesh)
    sharded_params, _ = load_params(model_dir, shardings=shardings)
    q = sharded_params["model"]["layers"]["self_attn"]["q_proj"]["kernel"]
    emb = sharded_params["model"]["embed_tokens"]["embedding"]
    placed = jax.device_put(inputs, inputs_shardings(inputs, mesh))
    logits = forward_inputs(sharded_params, cfg, placed)
    tokens = greedy_generate(sharded_params, cfg, placed, max_new_tokens=6)[0]
    print(json.dumps({
        "max_diff": float(np.max(np.abs(np.asarray(logits) - single))),
        "tokens_equal": bool(np.array_equal(np.asarray(tokens), single_tokens)),
        "tokens_spec": str(tokens.sharding.spec),
        "q_spec": str(q.sharding.spec), "q_shard": list(q.addressable_shards[0].data.shape),
        "emb_shard": list(emb.addressable_shards[0].data.shape),
        "logits_devices": len(logits.sharding.device_set),
        "odd_dim_spec": str(spec_for("model/layers/mlp/up_proj/kernel", (2, 6, 10), mesh)),
    }))
""")


@pytest.mark.e2e
def test_sharded_forward_equals_single_device(tmp_path):
    model_dir, _ = save_tiny(tmp_path / "ckpt", seed=11, heads=4, kv_heads=2)
    ids, mask, pv, grids = two_image_batch(np.random.default_rng(3), PATCH_DIM, 1000)
    # A batch of 4 (two copies) so the batch splits over the 4-way fsdp axis.
    ids, mask = np.concatenate([ids, ids[::-1]]), np.concatenate([mask, mask[::-1]])
    pv = np.concatenate([pv, pv[48:56], pv[:48]])  # images in batch order: row 2 = old row 1, row 3 = old row 0
    grids = grids + [grids[2], grids[0], grids[1]]
    np.savez(tmp_path / "batch.npz", ids=ids, mask=mask, pv=pv, grids=np.asarray(grids))
    stdout = fake_devices.run(SCRIPT, str(tmp_path / "ckpt"), str(tmp_path / "batch.npz"), timeout=600)
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["max_diff"] <= 1e-5, out
    assert out["tokens_equal"] and "fsdp" in out["tokens_spec"], out
    # q_proj kernel [L=2, H=64, 64]: input dim over fsdp (4), output dim over tensor (2).
    assert out["q_spec"] == "P(None, 'fsdp', 'tensor')" and out["q_shard"] == [2, 16, 32]
    assert out["emb_shard"] == [500, 16]  # vocabulary over tensor, width over fsdp
    assert out["logits_devices"] == 8  # the forward ran spread over the mesh, not gathered onto one device
    assert out["odd_dim_spec"] == "P(None, None, 'tensor')"  # 6 is not divisible by fsdp=4
