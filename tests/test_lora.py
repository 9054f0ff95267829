"""LoRA adapters on the stacked Qwen2-VL parameter tree: init, merge math, training, export."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from support import small_models, toy_lm

from ipl_jax.training import (
    lora,
    sft,
)
from ipl_jax.training import optimizer as optim
from ipl_jax.training import state as tstate
from ipl_jax.training.lora import LoraConfig, LoraParams, flatten_with_paths, init_lora, merge_lora

TEXT_KERNELS = [f"model/layers/self_attn/{n}_proj/kernel" for n in "qkvo"] + [
    f"model/layers/mlp/{n}_proj/kernel" for n in ("gate", "up", "down")
]


def test_init_targets_stacked_kernels_and_is_a_no_op():
    cfg = small_models.tiny_cfg()
    params = small_models.numpy_params(cfg)
    adapters = jax.jit(init_lora, static_argnums=1)(params, LoraConfig(rank=4, alpha=8.0), jax.random.PRNGKey(0))
    flat = flatten_with_paths(adapters.adapters)
    assert sorted(p.rsplit("/", 1)[0] for p in flat if p.endswith("/a")) == sorted(TEXT_KERNELS)
    base = flatten_with_paths(params)
    for path in TEXT_KERNELS:
        n_layers, d_in, d_out = base[path].shape
        assert flat[path + "/a"].shape == (n_layers, d_in, 4) and flat[path + "/b"].shape == (n_layers, 4, d_out)
        assert not np.any(np.asarray(flat[path + "/b"]))
        assert np.all(np.abs(np.asarray(flat[path + "/a"])) <= 1 / np.sqrt(d_in))
    assert adapters.scale == 2.0 and adapters.rank == 4
    merged = merge_lora(params, adapters)
    jax.tree.map(np.testing.assert_array_equal, merged, params)
    vision = init_lora(params, LoraConfig(rank=2, targets=lora.VISION_TARGETS), jax.random.PRNGKey(0))
    assert len(jax.tree.leaves(vision.adapters)) == 2 * 4  # qkv, proj, fc1, fc2


def test_merge_equals_side_branch_per_layer():
    """x @ W' == x @ W + scale·(x @ A) @ B for every stacked layer (the un-merged adapted layer)."""
    cfg = small_models.tiny_cfg()
    params = small_models.numpy_params(cfg)
    shapes = jax.eval_shape(lambda p: init_lora(p, LoraConfig(rank=3, alpha=6.0), jax.random.PRNGKey(1)), params)
    rng = np.random.default_rng(0)
    ad = LoraParams(
        adapters=jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), shapes.adapters),
        scale=shapes.scale,
    )
    merged = flatten_with_paths(merge_lora(params, ad))
    base, flat = flatten_with_paths(params), flatten_with_paths(ad.adapters)
    path = "model/layers/mlp/down_proj/kernel"
    x = rng.standard_normal((5, base[path].shape[1]))
    for layer in range(base[path].shape[0]):
        a, b = np.asarray(flat[path + "/a"][layer], np.float64), np.asarray(flat[path + "/b"][layer], np.float64)
        expected = x @ np.asarray(base[path][layer], np.float64) + 2.0 * (x @ a) @ b
        np.testing.assert_allclose(x @ np.asarray(merged[path][layer], np.float64), expected, rtol=1e-5, atol=1e-5)
    untouched = "model/layers/self_attn/q_proj/bias"
    np.testing.assert_array_equal(merged[untouched], base[untouched])


def test_bad_targets_are_named():
    params = small_models.numpy_params(small_models.tiny_cfg())
    with pytest.raises(ValueError, match="matches no parameter"):
        init_lora(params, LoraConfig(targets=(r"nope_proj/kernel$",)), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"model/norm/scale"):
        init_lora(params, LoraConfig(targets=(r"^model/norm/scale$",)), jax.random.PRNGKey(0))


@pytest.mark.e2e
def test_lora_training_changes_only_adapters_and_export_matches(tmp_path):
    """SFT with LoRA: the base weights are bit-identical after training, the adapters moved, the loss went down;
    merged weights written as a Hugging Face checkpoint and loaded back give the adapted model's logits."""
    from ipl_jax import model as M

    cfg = small_models.tiny_cfg()
    params = small_models.numpy_params(cfg)
    base_before = jax.tree.map(np.array, params)
    config = toy_lm.opt_config(learning_rate=3e-2, warmup_steps=0, schedule="constant", weight_decay=0.0)
    opt = optim.make_optimizer(config)
    state = tstate.create_train_state(params, opt, jax.random.PRNGKey(0), lora=LoraConfig(rank=4, alpha=8.0))
    a_before = jax.tree.map(np.array, state.params.adapters)
    # Adam moments exist for the adapters only: 2 × adapter size (+ scalar step counters).
    n_adapter = sum(x.size for x in jax.tree.leaves(state.params))
    n_opt = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert n_opt == 2 * n_adapter < sum(x.size for x in jax.tree.leaves(params))
    batch = sft.sft_model_batch(cfg, small_models.tiny_training_batch(cfg, 0))
    step_config = sft.SFTStepConfig(model=cfg, optimizer=config, logp_chunk=8)
    losses = []
    for _ in range(3):
        state, metrics = sft.sft_step(state, batch, step_config)
        losses.append(float(metrics["loss"]))
    assert losses[2] < losses[0]
    jax.tree.map(np.testing.assert_array_equal, state.frozen, base_before)
    moved = jax.tree.map(lambda n, o: not np.array_equal(n, o), state.params.adapters, a_before)
    assert all(jax.tree.leaves(moved))

    with jax.default_matmul_precision("highest"):
        adapted = tstate.model_params(state.params, state.frozen)  # what the loss saw (merged on the fly)
        feats = M.encode_images(adapted, cfg, batch["vision"])
        logits = M.forward(adapted, cfg, batch["input_ids"], batch["positions"], batch["attention_mask"], feats)
        M.save_params(jax.device_get(merge_lora(state.frozen, state.params)), cfg, str(tmp_path / "hf"))
        loaded, cfg2 = M.load_params(str(tmp_path / "hf"))
        feats2 = M.encode_images(loaded, cfg2, batch["vision"])
        logits2 = M.forward(loaded, cfg2, batch["input_ids"], batch["positions"], batch["attention_mask"], feats2)
        base_logits = M.forward(
            state.frozen,
            cfg,
            batch["input_ids"],
            batch["positions"],
            batch["attention_mask"],
            M.encode_images(state.frozen, cfg, batch["vision"]),
        )
    np.testing.assert_allclose(np.asarray(logits2), np.asarray(logits), atol=1e-5, rtol=0)
    assert np.max(np.abs(np.asarray(base_logits) - np.asarray(logits))) > 1e-2  # the adapters matter


def test_lora_shardings_follow_base_kernels():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    params = {"model": {"layers": {"mlp": {"up_proj": {"kernel": jnp.zeros((2, 8, 6))}}}}}
    base_sh = {"model": {"layers": {"mlp": {"up_proj": {"kernel": NamedSharding(mesh, P(None, "fsdp", "tensor"))}}}}}
    ad = init_lora(params, LoraConfig(rank=2, targets=("up_proj/kernel$",)), jax.random.PRNGKey(0))
    sh = lora.lora_shardings(ad, base_sh).adapters["model"]["layers"]["mlp"]["up_proj"]["kernel"]
    assert sh["a"].spec == P(None, "fsdp", None) and sh["b"].spec == P(None, None, "tensor")


@pytest.mark.e2e
def test_lora_on_a_moe_model_trains_the_attention_and_opt_in_experts():
    """Qwen3-VL-MoE: the default targets are the attention projections (no router, no experts); with
    ``EXPERT_TARGETS`` each expert of each layer gets its adapter, merged as W[l, e] + scale·A[l, e] @ B[l, e]; two
    SFT steps move every adapter, keep the base bit-identical and the loss finite."""
    cfg = small_models.tiny_moe_cfg()
    params = small_models.numpy_params(cfg)
    attention = sorted(f"model/layers/self_attn/{n}_proj/kernel" for n in "qkvo")
    default = flatten_with_paths(init_lora(params, LoraConfig(rank=4), jax.random.PRNGKey(0)).adapters)
    assert sorted(p.rsplit("/", 1)[0] for p in default if p.endswith("/a")) == attention
    lcfg = LoraConfig(rank=4, alpha=8.0, targets=lora.LANGUAGE_TARGETS + lora.EXPERT_TARGETS)
    ad = init_lora(params, lcfg, jax.random.PRNGKey(0))
    flat = flatten_with_paths(ad.adapters)
    gate_up = "model/layers/mlp/experts/gate_up_proj"
    assert flat[gate_up + "/a"].shape == (2, 4, 32, 4) and flat[gate_up + "/b"].shape == (2, 4, 4, 24)
    rng = np.random.default_rng(0)
    noisy = LoraParams(adapters=jax.tree.map(lambda x: rng.standard_normal(x.shape), ad.adapters), scale=ad.scale)
    merged, nf = flatten_with_paths(merge_lora(params, noisy))[gate_up], flatten_with_paths(noisy.adapters)
    want = np.asarray(params["model"]["layers"]["mlp"]["experts"]["gate_up_proj"])[1, 3] + 2.0 * (
        nf[gate_up + "/a"][1, 3] @ nf[gate_up + "/b"][1, 3]
    )
    np.testing.assert_allclose(np.asarray(merged[1, 3]), want, rtol=1e-5, atol=1e-5)

    base_before = jax.tree.map(np.array, params)
    config = toy_lm.opt_config(learning_rate=3e-2, warmup_steps=0, schedule="constant", weight_decay=0.0)
    state = tstate.create_train_state(params, optim.make_optimizer(config), jax.random.PRNGKey(0), lora=lcfg)
    a_before = jax.tree.map(np.array, state.params.adapters)
    batch = sft.sft_model_batch(cfg, small_models.tiny_training_batch(cfg, 0))
    step_config = sft.SFTStepConfig(model=cfg, optimizer=config, logp_chunk=8)
    for _ in range(2):
        state, metrics = sft.sft_step(state, batch, step_config)
        assert np.isfinite(float(metrics["loss"]))
    jax.tree.map(np.testing.assert_array_equal, state.frozen, base_before)
    moved = jax.tree.map(lambda n, o: not np.array_equal(n, o), state.params.adapters, a_before)
    assert all(jax.tree.leaves(moved))
