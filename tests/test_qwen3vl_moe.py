"""Qwen3-VL-MoE against transformers' ``Qwen3VLMoeForConditionalGeneration`` on tiny random checkpoints that
transformers builds from its own config classes: logits (float32, max |difference| <= 1e-4) with images and a
text-only row in one batch, top-1 and top-2 routing over 4 and 6 experts, tied and untied embeddings, a square
fused gate-and-up projection (hidden == 2 x moe_intermediate, whose layout transformers tells by shape alone);
greedy decoding against ``generate``; the export loading back in transformers as Qwen3-VL-MoE in the published
expert layout; the refused fields; and the forward with the experts split over a mesh of fake CPU devices equal to
the single-device one."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from support import fake_devices, hf_models  # noqa: E402
from test_qwen3vl_model import PATCH_BUCKET, VOCAB, batch  # noqa: E402

from ipl_jax.model.config import Qwen2VLConfig  # noqa: E402
from ipl_jax.model.decode import greedy_generate  # noqa: E402
from ipl_jax.model.inputs import prepare_inputs  # noqa: E402
from ipl_jax.model.text import forward_inputs  # noqa: E402
from ipl_jax.model.weights import load_params, save_params  # noqa: E402

TOL = 1e-4
_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, num_position_embeddings=36)
# "top1": 4 experts, one per token, untied, GQA 4:2, expert width 24 (gate_up [4, 64, 48]).
# "top2": 6 experts, two per token, tied, odd widths (72 over 3 heads of 20), one KV head, attention biases, expert
# width 36: the fused gate_up is square ([6, 72, 72]), so its file layout is transformers-5's.
CONFIGS = {
    "top1": dict(
        text=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4),
        experts=dict(num_experts=4, num_experts_per_tok=1, moe_intermediate_size=24),
        kv=2,
        head_dim=16,
        mrope=[4, 2, 2],
        vision=_VISION,
        taps=[1],
        tie=False,
        bias=False,
        seed=0,
    ),
    "top2": dict(
        text=dict(hidden_size=72, intermediate_size=100, num_hidden_layers=3, num_attention_heads=3),
        experts=dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=36),
        kv=1,
        head_dim=20,
        mrope=[4, 3, 3],
        vision=_VISION,
        taps=[0, 1],
        tie=True,
        bias=True,
        seed=1,
    ),
}

pytestmark = pytest.mark.usefixtures("highest_precision")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_models.saved_models(tmp_path_factory, functools.partial(hf_models.tiny_qwen3_model, vocab=VOCAB), CONFIGS)


def ours(params, cfg, ids, mask, pv, grids):
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET,))
    return np.asarray(forward_inputs(params, cfg, inputs))[:, : ids.shape[1]]


@pytest.mark.parametrize("dispatch", ["dense", "grouped"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(models, name, dispatch):
    model_dir, hf_model = models[name]
    kw = CONFIGS[name]
    ids, mask, pv, grids = batch(kw["seed"])
    params, cfg = load_params(model_dir)
    cfg = cfg.replace(moe_dispatch=dispatch)
    assert cfg.model_type == "qwen3_vl" and cfg.hf_model_type == "qwen3_vl_moe"
    assert cfg.tie_word_embeddings == kw["tie"]
    e = kw["experts"]
    assert (cfg.text.num_experts, cfg.text.num_experts_per_tok, cfg.text.moe_intermediate_size) == tuple(e.values())
    ref = hf_models.hf_forward(hf_model, ids, mask, pv, grids)
    logits = ours(params, cfg, ids, mask, pv, grids)
    hf_models.assert_logits_close(f"qwen3-vl-moe {name} {dispatch}", logits, ref, mask, TOL)
    if dispatch != "dense":  # the same sums as the dense dispatch, in another order
        dense = ours(params, cfg.replace(moe_dispatch="dense"), ids, mask, pv, grids)
        np.testing.assert_allclose(logits[mask.astype(bool)], dense[mask.astype(bool)], rtol=0, atol=1e-5)
    # the routing matters: every expert at once (or one fewer / more) moves the logits far beyond the tolerance
    k = e["num_experts_per_tok"]
    other = cfg.replace(text=dataclasses.replace(cfg.text, num_experts_per_tok=k + 1))
    got = ours(params, other, ids, mask, pv, grids)
    assert np.max(np.abs(got - ref)[mask.astype(bool)]) > 100 * TOL


def test_greedy_matches_transformers_generate(models):
    model_dir, hf_model = models["top2"]
    ids, mask, pv, grids = batch(3)
    ref = hf_models.hf_greedy(hf_model, ids, mask, pv, grids, max_new_tokens=4)
    params, cfg = load_params(model_dir)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET,))
    tokens, n = greedy_generate(params, cfg, inputs, max_new_tokens=4)
    np.testing.assert_array_equal(np.asarray(tokens), ref)
    assert np.asarray(n).tolist() == [4, 4, 4]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_loads_in_transformers(models, tmp_path, name):
    model_dir, hf_model = models[name]
    params, cfg = load_params(model_dir)
    save_params(params, cfg, str(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3VLMoeForConditionalGeneration"] and saved["model_type"] == "qwen3_vl_moe"
    assert Qwen2VLConfig.from_dir(tmp_path) == cfg
    t = cfg.text
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        gate_up = f.get_slice("model.language_model.layers.0.mlp.experts.gate_up_proj").get_shape()
        down = f.get_slice("model.language_model.layers.0.mlp.experts.down_proj").get_shape()
    # the published layout (experts, in, out); square [E, 72, 72] is the same shape either way
    assert (gate_up, down) == (
        [t.num_experts, t.hidden_size, 2 * t.moe_intermediate_size],
        [t.num_experts, t.moe_intermediate_size, t.hidden_size],
    )
    hf_models.assert_reloads_equal(tmp_path, hf_model, "Qwen3VLMoeForConditionalGeneration")


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("decoder_sparse_step", 2, "text_config.decoder_sparse_step 2"),
        ("mlp_only_layers", [0], "text_config.mlp_only_layers [0]"),
        ("norm_topk_prob", False, "text_config.norm_topk_prob false"),
        ("num_experts_per_tok", 5, "num_experts_per_tok 5 must be in 1..num_experts (4)"),
        ("num_experts", 0, "text_config.num_experts 0"),
    ],
)
def test_bad_configs_name_the_file_and_field(tmp_path, field, value, needle):
    text = dict(hidden_size=64, num_attention_heads=4, head_dim=16, num_experts=4, num_experts_per_tok=2)
    text["rope_parameters"] = {"mrope_section": [2, 3, 3]}
    d = {
        "model_type": "qwen3_vl_moe",
        "text_config": {**text, field: value},
        "vision_config": {"out_hidden_size": 64, "hidden_size": 32, "num_heads": 2},
    }
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        Qwen2VLConfig.from_dir(tmp_path)
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "config.json")) and needle in msg and "\n" not in msg


SHARDED = """
import json, sys
import numpy as np
import jax
from ipl_jax.model.inputs import prepare_inputs
from ipl_jax.model.params import param_shapes
from ipl_jax.model.sharding import inputs_shardings, make_mesh, param_shardings
from ipl_jax.model.text import forward_inputs
from ipl_jax.model.weights import load_params

model_dir, batch_file = sys.argv[1], sys.argv[2]
data = np.load(batch_file)
jax.config.update("jax_default_matmul_precision", "highest")
params, cfg = load_params(model_dir)
inputs = prepare_inputs(cfg, data["ids"], data["mask"], data["pv"], data["grids"], text_buckets=(128,),
                        patch_buckets=(192,))
single = np.asarray(forward_inputs(params, cfg.replace(moe_dispatch="dense"), inputs))
mesh = make_mesh((1, 4, 2))
sharded, _ = load_params(model_dir, shardings=param_shardings(param_shapes(cfg), mesh))
gate_up = sharded["model"]["layers"]["mlp"]["experts"]["gate_up_proj"]
placed = jax.device_put(inputs, inputs_shardings(inputs, mesh))
logits = forward_inputs(sharded, cfg.replace(moe_dispatch="dense"), placed)
grouped = forward_inputs(sharded, cfg.replace(moe_dispatch="grouped"), placed)
print(json.dumps({
    "max_diff": float(np.max(np.abs(np.asarray(logits) - single))),
    "grouped_diff": float(np.max(np.abs(np.asarray(grouped) - single))),
    "spec": str(gate_up.sharding.spec), "shard": list(gate_up.addressable_shards[0].data.shape),
    "devices": len(logits.sharding.device_set),
}))
"""


def test_experts_split_over_the_mesh_equal_one_device(models, tmp_path):
    """The 4 experts of "top1" over fsdp=4 (one per device), their widths over tensor=2: same logits, by the dense
    and the grouped dispatch."""
    model_dir, _ = models["top1"]
    ids, mask, pv, grids = batch(0)
    ids, mask = np.concatenate([ids, ids[:1]]), np.concatenate([mask, mask[:1]])  # 4 rows: the batch splits too
    pv = np.concatenate([pv, pv[: 24 + 24]])
    grids = grids + grids[:2]
    np.savez(tmp_path / "batch.npz", ids=ids, mask=mask, pv=pv, grids=np.asarray(grids))
    stdout = fake_devices.run(SHARDED, model_dir, str(tmp_path / "batch.npz"), timeout=600)
    out = json.loads(stdout.strip().splitlines()[-1])
    print(out)
    assert out["max_diff"] <= 1e-5 and out["grouped_diff"] <= 1e-5, out
    assert out["spec"] == "P(None, 'fsdp', None, 'tensor')" and out["shard"] == [2, 1, 64, 24], out
    assert out["devices"] == 8


def test_experts_in_position_chunks_equal_all_at_once(models):
    """``sparse_mlp`` a few positions of each row at a time (T = 50 over chunks of 16, padded) equals one pass."""
    import jax

    from ipl_jax.model.experts import sparse_mlp

    params, cfg = load_params(models["top2"][0])
    mp = jax.tree.map(lambda a: a[0], params["model"]["layers"]["mlp"])
    h = jax.random.normal(jax.random.key(0), (2, 50, cfg.text.hidden_size))
    whole = np.asarray(sparse_mlp(mp, cfg.text, h, chunk=64))
    np.testing.assert_allclose(np.asarray(sparse_mlp(mp, cfg.text, h, chunk=16)), whole, rtol=1e-5, atol=1e-5)
    assert np.abs(whole).mean() > 0.1


@pytest.mark.e2e
def test_grouped_gradient_equals_dense(models):
    """The gradient of a scalar loss of the logits (every parameter) by the grouped dispatch equals the dense
    one's within 1e-5 relative."""
    import jax
    import jax.numpy as jnp

    params, cfg = load_params(models["top2"][0])
    ids, mask, pv, grids = batch(2)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET,))
    weight = jnp.asarray(np.random.default_rng(0).normal(size=(VOCAB,)), jnp.float32)

    def grads(dispatch):
        def loss(p):
            logits = forward_inputs(p, cfg.replace(moe_dispatch=dispatch), inputs)
            return jnp.sum(jax.nn.log_softmax(logits) * weight * inputs.attention_mask[..., None])

        return jax.tree.leaves(jax.jit(jax.grad(loss))(params))

    for a, b in zip(grads("grouped"), grads("dense")):
        assert float(np.max(np.abs(np.asarray(a) - b))) <= 1e-5 * max(float(np.max(np.abs(b))), 1e-6)
    experts = params["model"]["layers"]["mlp"]["experts"]
    assert np.abs(np.asarray(jax.tree.leaves(experts)[0])).max() > 0


def test_grouped_blocks_pad_each_expert():
    """``block_rows``: a power of two near the mean group; the grouped and ragged dispatches with every token on
    the same two experts (the largest padding) equal the dense one, values and gradients."""
    import jax

    from ipl_jax.model.config import TextConfig
    from ipl_jax.model.experts import block_rows, sparse_mlp

    assert [block_rows(n, 4) for n in (8, 64, 100, 4096)] == [8, 16, 16, 256]
    t = TextConfig(hidden_size=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    k = jax.random.split(jax.random.key(1), 3)
    router = np.zeros((16, 4), np.float32)
    router[:, 2], router[:, 0] = 50.0, 10.0  # every token's top-2: experts 2 and 0
    mp = {
        "gate": {"kernel": jax.numpy.asarray(router)},
        "experts": {
            "gate_up_proj": jax.random.normal(k[0], (4, 16, 16)),
            "down_proj": jax.random.normal(k[1], (4, 8, 16)),
        },
    }
    h = jax.numpy.abs(jax.random.normal(k[2], (2, 37, 16)))
    dense = np.asarray(sparse_mlp(mp, t, h, "dense"))
    np.testing.assert_allclose(np.asarray(sparse_mlp(mp, t, h, "grouped")), dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sparse_mlp(mp, t, h, "grouped", chunk=8)), dense, rtol=1e-5, atol=1e-5)

    def grads(dispatch):
        return jax.grad(lambda mp, h: jax.numpy.sum(jax.numpy.sin(sparse_mlp(mp, t, h, dispatch))), (0, 1))(mp, h)

    want = jax.tree.leaves(grads("dense"))
    for dispatch in ("grouped", "ragged"):
        np.testing.assert_allclose(np.asarray(sparse_mlp(mp, t, h, dispatch)), dense, rtol=1e-5, atol=1e-5)
        for a, b in zip(jax.tree.leaves(grads(dispatch)), want):
            assert float(np.max(np.abs(a - b))) <= 1e-5 * max(float(np.max(np.abs(b))), 1e-6), dispatch


@pytest.mark.e2e
def test_greedy_tree_sampler_equals_greedy_decoding(models):
    """The CoaT-tree sampler on "top2" (KV caches of shared prefixes, two branches at the first two turns) at
    temperature 0: every node is ``greedy_generate``'s turn-by-turn decoding (itself equal to transformers'
    ``generate`` above)."""
    import jax
    from support import EOS, IMAGE, VIDEO
    from support.sampler_models import assert_greedy_tree_is_greedy_decoding, random_step

    from ipl_jax.sampling.config import SamplerConfig
    from ipl_jax.sampling.prompts import pack_tree_prompts
    from ipl_jax.sampling.tree_sampler import sample_tree

    params, cfg = load_params(models["top2"][0])
    config = SamplerConfig(
        branching=(2, 2, 1, 1),
        max_turn_tokens=(4, 3, 3, 3),
        temperature=0.0,
        eos_ids=(EOS,),
        suppress_ids=(IMAGE, VIDEO),
        prefix_buckets=(32,),
        prompt_buckets=(8,),
        patch_buckets=(64,),
    )
    rng = np.random.default_rng(0)
    steps = [
        random_step(rng, cfg, uid=i, n_text=n, prompt_lens=(5, 3, 4), grid=g)
        for i, (n, g) in enumerate(((6, (1, 4, 4)), (11, (1, 4, 6))))
    ]
    tree = jax.device_get(sample_tree(params, cfg, pack_tree_prompts(cfg, steps, config, 0), config))
    total = assert_greedy_tree_is_greedy_decoding(params, cfg, steps, config, tree, 64, patch_bucket=32)
    assert total > sum(len(s.prefix_ids) for s in steps) + 8
