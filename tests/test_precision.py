"""bf16 compute against fp32 on the small model (bounded error, fp32 log-softmax and losses), a bf16 T-DPO step
with fp32 master weights and optimizer state, the job's dtype settings and their one-line errors."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.small_models import make_groups, numpy_params, packed_round, tiny_cfg

from ipl_jax import model as M
from ipl_jax.configs.loader import load_settings
from ipl_jax.model.decode import init_cache
from ipl_jax.preference import losses
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.preference import tdpo as ipl
from ipl_jax.settings import SettingsError
from ipl_jax.training.state import VISION_REGEX, Precision, cast_floating


@pytest.fixture(scope="module")
def small():
    cfg = tiny_cfg()
    return cfg, numpy_params(cfg, seed=4, std=0.3)


def _packed(cfg):
    groups = make_groups(cfg, seed=5, n_groups=3, conts=(3, 2, 4))
    pairs = [PB.PairRef(0, 0, 1, 1), PB.PairRef(0, 2, 1, 2), PB.PairRef(1, 1, 0, 3), PB.PairRef(2, 3, 0, 4)]
    return packed_round(cfg, groups, pairs)


@pytest.mark.e2e
def test_bf16_forward_stays_close_to_fp32(small, highest_precision):
    cfg, params = small
    batch = _packed(cfg)
    lp32, _ = PK.score_continuations(params, cfg, batch, chunk=16)
    b16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    lp16, _ = PK.score_continuations(cast_floating(params, jnp.bfloat16), b16, batch, chunk=16)
    assert lp16.dtype == jnp.float32  # log-softmax and sums in fp32
    lp32, lp16 = np.asarray(lp32), np.asarray(lp16)
    assert np.abs(lp32).max() > 3.0
    # bf16 keeps 8 bits of mantissa: a few 1e-2 relative per continuation, never a different model
    np.testing.assert_allclose(lp16, lp32, atol=0.05 + 0.03 * np.abs(lp32).max(), rtol=0)
    assert np.abs(lp16 - lp32).max() > 0  # it did compute in bf16
    # token-level: the same next-token choice almost everywhere
    ids, pos = jnp.asarray(batch.input_ids), jnp.asarray(batch.positions)
    seg = jnp.asarray(batch.segment_ids, jnp.int32)
    l32 = M.forward(params, cfg, ids, pos, seg)
    l16 = M.forward(cast_floating(params, jnp.bfloat16), b16, ids, pos, seg)
    assert l16.dtype == jnp.float32
    real = np.asarray(batch.segment_ids) >= 0
    agree = np.mean(np.argmax(np.asarray(l16), -1)[real] == np.argmax(np.asarray(l32), -1)[real])
    assert agree > 0.9, agree


def test_kv_cache_is_kept_in_the_compute_dtype(small):
    cfg, _ = small
    assert init_cache(cfg.replace(dtype="bfloat16"), 2, 8).k.dtype == jnp.bfloat16
    assert init_cache(cfg, 2, 8).v.dtype == jnp.float32


@pytest.mark.e2e
def test_bf16_tdpo_step_keeps_fp32_master_weights_and_moments(small):
    cfg, params = small
    batch = _packed(cfg)
    dpo = losses.DPOSettings(beta=0.5, sft_weight=1.0)
    opt = dataclasses.replace(ipl.IPL_OPTIMIZER, learning_rate=1e-3)
    c32 = ipl.TDPOConfig(model=cfg, dpo=dpo, logp_chunk=16, optimizer_settings=opt)
    c16 = ipl.TDPOConfig(
        model=cfg.replace(dtype="bfloat16"),
        dpo=dpo,
        logp_chunk=16,
        optimizer_settings=opt,
        compute_dtype="bfloat16",
        reference_dtype="bfloat16",
        remat="full",
    )
    ref = jax.tree.map(lambda x: x * 1.05, params)
    host = jax.tree.map(np.asarray, params)  # the step donates its state: each run gets fresh buffers
    out = {}
    for name, conf, frozen in (("fp32", c32, None), ("bf16", c16, "bfloat16")):
        (b,) = ipl.attach_reference(ref, [batch], conf).batches
        fresh = jax.tree.map(jnp.asarray, host)
        state = ipl.init_state(fresh, conf, jax.random.PRNGKey(0), freeze_regex=VISION_REGEX, frozen_dtype=frozen)
        new, metrics = ipl.tdpo_step(state, b, conf)
        out[name] = (new, metrics, b)
    new, metrics, b16 = out["bf16"]
    assert {x.dtype for x in jax.tree.leaves(new.params)} == {jnp.dtype(jnp.float32)}
    floats = [x for x in jax.tree.leaves(new.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and {x.dtype for x in floats} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(new.frozen)} == {jnp.dtype(jnp.bfloat16)}  # the frozen ViT
    assert metrics["loss"].dtype == jnp.float32 and b16.ref_pos.dtype == jnp.float32
    new32, metrics32, b32 = out["fp32"]
    np.testing.assert_allclose(np.asarray(b16.ref_pos), np.asarray(b32.ref_pos), atol=0.5, rtol=0.05)
    assert abs(float(metrics["loss"]) - float(metrics32["loss"])) < 0.05 * max(1.0, abs(float(metrics32["loss"])))
    # the update moves the fp32 weights the way the fp32 step does
    d16 = np.concatenate(jax.tree.leaves(jax.tree.map(lambda a, p: np.ravel(a - p), new.params, new32.params)))
    step32 = np.concatenate(jax.tree.leaves(jax.tree.map(lambda n, o: np.ravel(n - o), new32.params, ipl_params(host))))
    assert np.linalg.norm(step32) > 0 and np.linalg.norm(d16) < 0.5 * np.linalg.norm(step32)


def ipl_params(params):
    """The trainable part of ``params`` when the vision tower is frozen (the state's ``params`` layout)."""
    return {k: v for k, v in params.items() if k != "visual"}


def _model(**fields):
    """The quick job's model settings with ``fields`` changed (checked again, like any settings)."""
    return dataclasses.replace(load_settings("synthetic:quick").model, **fields)


def test_job_precision_follows_the_checkpoint_by_default(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "vision_config": {}}))
    ckpt = str(tmp_path)
    assert _model().precision() == Precision("float32", "float32", "none")  # a fresh model
    assert _model(checkpoint=ckpt).resolved().precision() == Precision("bfloat16", "bfloat16", "none")
    mixed = _model(checkpoint=ckpt, param_dtype="float32").resolved()
    assert mixed.precision() == Precision("bfloat16", "float32", "none")
    assert _model(checkpoint=ckpt, dtype="float32", remat="full").precision() == Precision("float32", "float32", "full")
    assert mixed.precision().compute_dtype == "bfloat16"
    assert Precision("float32", "bfloat16", "none").frozen_dtype == "bfloat16"
    assert Precision("float32", "float32", "none").frozen_dtype is None


def test_resolution_reads_the_checkpoint_once_and_precision_reads_nothing(tmp_path, monkeypatch):
    """``Settings.resolved`` reads the checkpoint's torch_dtype (once) into the settings; ``precision()`` of the
    resolved settings touches no file (the checkpoint is gone); unresolved 'auto' with a checkpoint is an error."""
    from ipl_jax.settings import model as model_settings  # where the settings read the checkpoint's dtype

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "vision_config": {}}))
    reads = []
    real = model_settings.checkpoint_dtype
    monkeypatch.setattr(model_settings, "checkpoint_dtype", lambda p: reads.append(p) or real(p))
    settings = load_settings("synthetic:quick", [f"--config.model.checkpoint={ckpt}"])
    assert settings.model.dtype == settings.model.param_dtype == "auto"
    resolved = settings.resolved(1)
    assert reads == [str(ckpt)]
    assert (resolved.model.dtype, resolved.model.param_dtype) == ("bfloat16", "bfloat16")
    (ckpt / "config.json").unlink()
    ckpt.rmdir()
    assert resolved.model.precision() == Precision("bfloat16", "bfloat16", "none")
    assert resolved.resolved(1) == resolved  # resolving again changes nothing (and reads nothing)
    assert reads == [str(ckpt)]
    with pytest.raises(SettingsError, match=r"^config\.model\.dtype='auto': not resolved") as e:
        settings.model.precision()
    assert len(str(e.value).splitlines()) == 1


def test_resolution_makes_the_mesh_concrete():
    settings = load_settings("synthetic:quick", ["--config.mesh.data=2", "--config.mesh.fsdp=-1"])
    mesh = settings.resolved(8).mesh
    assert (mesh.data, mesh.fsdp, mesh.tensor) == (2, 4, 1) == settings.mesh.shape(8)
    one = settings.resolved(1).mesh  # one device: the job runs without a mesh
    assert (one.data, one.fsdp, one.tensor) == (1, 1, 1)
    with pytest.raises(SettingsError, match=r"does not fit 6 devices"):
        load_settings("synthetic:quick", ["--config.mesh.data=4"]).resolved(6)


@pytest.mark.parametrize(
    "model, platform, message",
    [
        (
            dict(dtype="bf16"),
            "cpu",
            "config.model.dtype='bf16': unknown (valid: auto, float32, bfloat16, float16)",
        ),
        (
            dict(param_dtype="float16"),
            "tpu",
            "config.model.param_dtype='float16': not available on tpu (valid: auto, float32, bfloat16)",
        ),
        (dict(attention="flash"), "cpu", "config.model.attention='flash': must be one of auto, reference, xla, cudnn"),
        (dict(attention="cudnn"), "cpu", "cuDNN attention needs a GPU, this backend is cpu"),
        (
            dict(attention="cudnn", dtype="float32"),
            "gpu",
            "config.model.attention='cudnn': cuDNN attention needs model.dtype bfloat16 or float16, not float32",
        ),
        (
            dict(remat="all"),
            "cpu",
            "config.model.remat='all': must be one of none, full, dots_saveable, dots_no_batch, offload",
        ),
    ],
)
def test_bad_model_settings_are_one_line(model, platform, message):
    with pytest.raises(SettingsError) as e:
        _model(**model).check_platform(platform)
    text = str(e.value)
    assert message in text and len(text.splitlines()) == 1, text
