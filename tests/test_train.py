"""TrainState, optimizer, the generic jitted step, the SFT loss and the NaN guard (on a toy LM)."""

import math
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import fake_devices
from support.compiles import count_traces
from support.small_models import numpy_params, tiny_cfg, tiny_training_batch
from support.toy_lm import opt_config, toy_batch, toy_logits, toy_params, toy_sft_loss, toy_sft_step

from ipl_jax.training import optimizer as optim
from ipl_jax.training import sft
from ipl_jax.training import state as tstate
from ipl_jax.training import step as tstep
from ipl_jax.training.checkpoint import Checkpointer
from ipl_jax.training.loop import NonFiniteLossError, TrainLoop
from ipl_jax.training.lora import flatten_with_paths


def sft_step_for(config, **kw):
    return toy_sft_step(toy_logits, optim.make_optimizer(config), optim.make_schedule(config), **kw)


# ------------------------------------------------------------------------------------------------ SFT loss


def test_next_token_nll_is_shifted_known_answer():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 4, 5)).astype(np.float32)
    ids = np.array([[3, 1, 4, 2]], np.int32)
    mask = np.array([[1, 0, 1, 1]], np.int32)  # token 0 can never be predicted; tokens 2 and 3 are targets
    nll, tokens = sft.next_token_nll(jnp.asarray(logits), ids, mask)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -(logp[0, 1, 4] + logp[0, 2, 2])
    assert float(tokens) == 2.0
    np.testing.assert_allclose(float(nll), expected, rtol=1e-6)
    loss, metrics = sft.sft_loss(jnp.asarray(logits), ids, mask)
    np.testing.assert_allclose(float(loss), expected / 2, rtol=1e-6)


# --------------------------------------------------------------------------------------------- optimizer


def test_schedules_known_values():
    cos = optim.make_schedule(opt_config(learning_rate=1.0, warmup_steps=4, total_steps=14, end_lr_ratio=0.1))
    np.testing.assert_allclose(
        [float(cos(s)) for s in (0, 2, 4, 9, 14)], [0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1], atol=1e-6
    )
    const = optim.make_schedule(opt_config(learning_rate=2.0, schedule="constant", warmup_steps=2))
    np.testing.assert_allclose([float(const(s)) for s in (0, 1, 2, 50)], [0.0, 1.0, 2.0, 2.0], atol=1e-6)
    with pytest.raises(ValueError, match="schedule"):
        optim.make_schedule(opt_config(schedule="linear"))


def test_weight_decay_skips_norms_and_biases():
    params = toy_params()
    mask = flatten_with_paths(optim.decay_mask(params))
    assert not mask["model/layers/input_layernorm/weight"] and not mask["model/norm/weight"]
    assert not mask["visual/proj/bias"]
    assert mask["model/layers/mlp/up_proj/kernel"] and mask["lm_head/kernel"]
    # With zero gradients AdamW only decays: kernels shrink by lr·wd, norms and biases stay put.
    opt = optim.make_optimizer(
        opt_config(learning_rate=0.1, schedule="constant", warmup_steps=0, weight_decay=0.5, grad_clip_norm=0.0)
    )

    @jax.jit
    def one_update(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        updates, _ = opt.update(zeros, opt.init(params), params)
        return optax.apply_updates(params, updates)

    new = flatten_with_paths(one_update(params))
    old = flatten_with_paths(params)
    np.testing.assert_allclose(new["lm_head/kernel"], old["lm_head/kernel"] * (1 - 0.05), rtol=1e-6)
    np.testing.assert_array_equal(new["model/norm/weight"], old["model/norm/weight"])
    np.testing.assert_array_equal(new["visual/proj/bias"], old["visual/proj/bias"])


def test_warm_up_sft_state_follows_the_sft_settings():
    """``sft.lora_rank`` gives LoRA adapters (alpha = 2 x rank) over frozen base weights; ``sft.freeze_vision``
    moves the vision tower to the frozen part, kept in ``model.param_dtype``."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.pipeline.sft_stage import sft_init_state
    from ipl_jax.training.lora import LoraParams

    params = toy_params()
    lora, _ = sft_init_state(params, load_settings("synthetic:quick", ["--config.sft.lora_rank=2"]))
    assert isinstance(lora.params, LoraParams) and lora.params.rank == 2 and lora.params.scale == 2.0
    assert set(flatten_with_paths(lora.frozen)) == set(flatten_with_paths(params))
    frozen_settings = load_settings(
        "synthetic:quick", ["--config.sft.freeze_vision=true", "--config.model.param_dtype=bfloat16"]
    )
    state, _ = sft_init_state(toy_params(), frozen_settings)
    assert "visual" in state.frozen and "visual" not in state.params
    assert state.frozen["visual"]["proj"]["kernel"].dtype == jnp.bfloat16


# ------------------------------------------------------------------------------------------------- step


def test_step_matches_manual_update_and_compiles_once():
    config = opt_config(weight_decay=0.01, grad_clip_norm=0.5)
    opt = optim.make_optimizer(config)
    params = toy_params()
    batch = toy_batch(1)

    def manual_loss(p):
        return sft.sft_loss(toy_logits(p, batch, None), batch["input_ids"], batch["loss_mask"])[0]

    @jax.jit
    def manual_step(params):
        loss, grads = jax.value_and_grad(manual_loss)(params)
        updates, _ = opt.update(grads, opt.init(params), params)
        return loss, optax.tree.norm(grads), optax.apply_updates(params, updates)

    loss, grad_norm, expected = manual_step(params)

    step = sft_step_for(config)
    state = tstate.create_train_state(params, opt, jax.random.PRNGKey(0))
    old_leaf = state.params["lm_head"]["kernel"]
    with count_traces() as traces:
        state, metrics = step(state, batch)
    assert old_leaf.is_deleted()  # the state was donated
    np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["grad_norm"]), float(grad_norm), rtol=1e-5)
    assert float(metrics["tokens"]) == float(batch["loss_mask"][:, 1:].sum())
    assert float(metrics["lr"]) == 0.0  # first warm-up step
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), state.params, expected)
    with count_traces() as retraces:
        for seed in (2, 3):
            state, metrics = step(state, toy_batch(seed))
    assert int(state.step) == 3
    np.testing.assert_allclose(float(metrics["lr"]), float(optim.make_schedule(config)(2)), rtol=1e-6)
    assert traces["step"] == 1 and retraces["step"] == 0


def test_grad_accumulation_equals_full_batch_token_mean():
    """Two micro-batches with different token counts == one batch of both (exact token weighting)."""
    config = opt_config()
    a, b = toy_batch(5, b=2, n_masked=[2, 3]), toy_batch(6, b=2, n_masked=[6, 7])
    full = {k: np.concatenate([a[k], b[k]]) for k in a}
    s1 = tstate.create_train_state(toy_params(), optim.make_optimizer(config), jax.random.PRNGKey(0))
    s2 = tstate.create_train_state(toy_params(), optim.make_optimizer(config), jax.random.PRNGKey(0))
    s1, m1 = sft_step_for(config)(s1, full)
    s2, m2 = sft_step_for(config, grad_accum_steps=2)(s2, tstep.stack_microbatches([a, b]))
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m2["grad_norm"]), rtol=1e-5)
    assert float(m1["tokens"]) == float(m2["tokens"]) == 18.0
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), s1.params, s2.params)


def test_frozen_vision_never_changes_and_has_no_optimizer_state():
    config = opt_config(weight_decay=0.1)
    opt = optim.make_optimizer(config)
    params = toy_params()
    before = jax.tree.map(np.array, params)  # the state (frozen part included) is donated to the step
    state = tstate.create_train_state(params, opt, jax.random.PRNGKey(0), freeze_regex=tstate.VISION_REGEX)
    assert "visual" not in state.params and "visual" in state.frozen
    assert not any("visual" in p for p in flatten_with_paths(state.opt_state))
    step = sft_step_for(config)
    for seed in range(3):
        state, _ = step(state, toy_batch(seed))
    np.testing.assert_array_equal(state.frozen["visual"]["proj"]["kernel"], before["visual"]["proj"]["kernel"])
    np.testing.assert_array_equal(state.frozen["visual"]["proj"]["bias"], before["visual"]["proj"]["bias"])
    assert not np.allclose(state.params["lm_head"]["kernel"], before["lm_head"]["kernel"])
    full = tstate.model_params(state.params, state.frozen)
    assert set(flatten_with_paths(full)) == set(flatten_with_paths(before))


def test_bf16_compute_keeps_fp32_master_weights():
    seen = []

    def logits_fn(p, batch, rng):
        seen.append(p["lm_head"]["kernel"].dtype)
        return toy_logits(p, batch, rng)

    config = opt_config()
    opt = optim.make_optimizer(config)
    batch = toy_batch(0)
    step16 = toy_sft_step(logits_fn, opt, compute_dtype=jnp.bfloat16)
    loss32 = jax.jit(lambda p: toy_sft_loss(toy_logits)(p, batch, None)[0])(toy_params())
    s16 = tstate.create_train_state(toy_params(), opt, jax.random.PRNGKey(0))
    s16, m16 = step16(s16, batch)
    m32 = {"loss": loss32}
    assert seen == [jnp.bfloat16]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(s16.params))
    assert all(
        x.dtype == jnp.float32
        for x in jax.tree.leaves(s16.opt_state)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
    )
    # bf16 has ~3 significant digits: the loss agrees to bf16 precision, not to fp32 precision.
    np.testing.assert_allclose(float(m16["loss"]), float(m32["loss"]), rtol=3e-2)
    assert float(m16["loss"]) != float(m32["loss"])


def test_nan_loss_stops_before_checkpoint_is_overwritten(tmp_path):
    def logits_fn(p, batch, rng):
        out = toy_logits(p, batch, rng)
        return jnp.where(batch["poison"][0] > 0, jnp.nan, out)

    config = opt_config()
    opt = optim.make_optimizer(config)
    step = toy_sft_step(logits_fn, opt)
    state = tstate.create_train_state(toy_params(), opt, jax.random.PRNGKey(0))

    def batches():
        for i in range(5):
            yield {**toy_batch(i), "poison": np.full((2,), int(i == 2), np.int32)}

    ckpt = Checkpointer(tmp_path / "ck", save_every=1, keep=5)
    loop = TrainLoop(step, kill_point="sft_step", desc="SFT", checkpointer=ckpt)
    with pytest.raises(NonFiniteLossError, match="step 3: loss is nan"):
        loop.run(state, batches(), num_steps=5)
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()


def test_step_uses_and_advances_the_rng():
    """Dropout draws from the state's key; the same key gives the same step, the key advances every step."""
    config = opt_config()
    opt = optim.make_optimizer(config)
    step = toy_sft_step(lambda p, b, r: toy_logits(p, b, r, dropout=0.5), opt)
    batch = toy_batch(0)
    losses = []
    for seed in (0, 0, 1):
        state = tstate.create_train_state(toy_params(), opt, jax.random.PRNGKey(seed))
        key0 = np.asarray(state.rng).copy()
        state, m = step(state, batch)
        assert not np.array_equal(np.asarray(state.rng), key0)
        losses.append(float(m["loss"]))
    assert losses[0] == losses[1] and losses[0] != losses[2]


# ---------------------------------------------------------------------------------------- the real model


def test_qwen2vl_sft_loss_matches_full_logits_loss():
    """The chunked hidden-state log-prob path == cross-entropy on the model's full logits, shift included."""
    from ipl_jax import model as M

    cfg = tiny_cfg()
    params = numpy_params(cfg)
    batch = sft.sft_model_batch(cfg, tiny_training_batch(cfg, 0, empty_rows=1))
    assert batch["positions"].shape == (3, 4, 32) and batch["vision"].patches.shape == (96, cfg.vision.patch_dim)
    with jax.default_matmul_precision("highest"):
        feats = M.encode_images(params, cfg, batch["vision"])
        logits = M.forward(params, cfg, batch["input_ids"], batch["positions"], batch["attention_mask"], feats)
        expected, m_ref = sft.sft_loss(logits, batch["input_ids"], batch["loss_mask"])
        loss, metrics = sft.qwen2vl_sft_loss(cfg, chunk=8)(params, batch, None)
    assert float(metrics["tokens"]) == float(m_ref["tokens"]) == float(batch["loss_mask"][:, 1:].sum())
    assert float(expected) > 1.0  # far from a trivial value
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)


MESH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from support import small_models as t
    from support.toy_lm import opt_config
    from ipl_jax.training import optimizer as optim, sft, state as tstate
    from ipl_jax.model import sharding as S

    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == 8
    cfg = t.tiny_cfg()
    config = opt_config(weight_decay=0.01, learning_rate=3e-3)
    opt = optim.make_optimizer(config)
    batches = [sft.sft_model_batch(cfg, t.tiny_training_batch(cfg, s)) for s in range(3)]

    step_config = sft.SFTStepConfig(model=cfg, optimizer=config, logp_chunk=8)

    def run(mesh):
        state = tstate.create_train_state(t.numpy_params(cfg), opt, jax.random.PRNGKey(0))
        if mesh is not None:
            state = jax.device_put(state, tstate.state_shardings(state, opt, mesh))
        losses = []
        for b in batches:
            if mesh is not None:
                b = jax.device_put(b, sft.sft_batch_shardings(b, mesh))
            state, m = sft.sft_step(state, b, step_config, mesh=mesh)
            losses.append(float(m["loss"]))
        leaf = state.params["model"]["layers"]["mlp"]["up_proj"]["kernel"]
        mu = state.opt_state[1][0].mu["model"]["layers"]["mlp"]["up_proj"]["kernel"]
        specs = [str(getattr(x.sharding, "spec", "")) for x in (leaf, mu)]
        return losses, specs, np.asarray(leaf)

    single, _, p1 = run(None)
    sharded, specs, p8 = run(S.make_mesh((2, 2, 2)))
    print(json.dumps({"single": single, "sharded": sharded, "specs": specs,
                      "param_diff": float(np.max(np.abs(p1 - p8)))}))
    """
)


@pytest.mark.e2e
def test_qwen2vl_sft_step_on_8_device_mesh_matches_single_device():
    import json

    out = json.loads(fake_devices.run(MESH_SCRIPT, fake_devices.TESTS).strip().splitlines()[-1])
    # The weights and their Adam moments really are split over fsdp × tensor.
    assert all("fsdp" in spec and "tensor" in spec for spec in out["specs"]), out["specs"]
    assert all(math.isfinite(x) and x > 0.5 for x in out["single"])
    assert out["single"][0] != out["single"][2]
    np.testing.assert_allclose(out["sharded"], out["single"], atol=1e-5, rtol=0)
    assert out["param_diff"] <= 1e-5


def test_the_sft_step_compiles_once_per_settings():
    """Each continued-SFT round builds its step's settings anew; equal settings are the same program: the second
    round traces (and compiles) nothing."""
    cfg = tiny_cfg()
    config = opt_config(learning_rate=3e-3)
    batch = sft.sft_model_batch(cfg, tiny_training_batch(cfg, 0))

    def one_round(seed):
        step_config = sft.SFTStepConfig(model=cfg, optimizer=config, logp_chunk=8)
        state = tstate.create_train_state(numpy_params(cfg), optim.make_optimizer(config), jax.random.PRNGKey(seed))
        for _ in range(2):
            state, metrics = sft.sft_step(state, batch, step_config)
        return float(metrics["loss"])

    with count_traces() as first:
        loss = one_round(0)
    with count_traces() as second:
        assert one_round(0) == loss
    assert first["_sft_update"] <= 1 and second["_sft_update"] == 0


def test_train_state_keeps_the_callers_key_alive_through_a_donated_step():
    # A round loop folds batch keys from the key it built the state with (rl.grpo.grpo_round); the state is
    # donated to every step, so the state must hold its own copy of that key.
    key = jax.random.PRNGKey(3)
    state = tstate.create_train_state({"w": jnp.ones((3,))}, optax.sgd(0.1), key)
    bump = jax.jit(lambda s: s.replace(step=s.step + 1, rng=jax.random.fold_in(s.rng, 1)), donate_argnums=0)
    state = bump(state)
    np.testing.assert_array_equal(np.asarray(jax.random.fold_in(key, 2)), np.asarray(jax.random.fold_in(key, 2)))
    assert int(state.step) == 1
