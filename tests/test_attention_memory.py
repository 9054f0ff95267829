"""Attention implementations, rematerialisation policies, per-image vision attention and LoRA inside the layer
scan: each alternative computes the same numbers as the reference path on the small model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.small_models import make_groups, numpy_params, packed_round, tiny_cfg, tiny_training_batch
from support.trees import assert_trees_close

from ipl_jax import model as M
from ipl_jax.model.layers import REMAT_POLICIES, check_remat
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.training import sft
from ipl_jax.training import state as tstate
from ipl_jax.training.lora import LoraConfig, merge_lora


@pytest.fixture(scope="module")
def small():
    cfg = tiny_cfg().replace(attention_query_chunk=16)  # several query chunks per 64-token row
    return cfg, numpy_params(cfg, std=0.3)


def _packed_batch(cfg):
    groups = make_groups(cfg, seed=2, scored_groups=(1,))
    return packed_round(cfg, groups, [PB.PairRef(g, 0, 1, 1) for g in range(3)])


@pytest.mark.e2e
def test_fused_attention_equals_reference_on_packed_rows(small, highest_precision):
    cfg, params = small
    batch = _packed_batch(cfg)
    ref, n_ref = PK.score_continuations(params, cfg, batch, chunk=16)
    fused, n_fused = PK.score_continuations(params, cfg.replace(attention="xla"), batch, chunk=16)
    assert np.abs(np.asarray(ref)).max() > 1.0
    np.testing.assert_allclose(np.asarray(fused), np.asarray(ref), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(n_fused), np.asarray(n_ref))
    # the packed spec (segment ids, masks built per chunk) means the materialised bool[B, T, T] mask
    ids, pos = jnp.asarray(batch.input_ids), jnp.asarray(batch.positions)
    seg = jnp.asarray(batch.segment_ids, jnp.int32)
    by_ids = M.forward_hidden(params, cfg, ids, pos, seg)
    by_mask = M.forward_hidden(params, cfg, ids, pos, PK.packed_attention_mask(seg))
    real = np.asarray(batch.segment_ids) >= 0
    np.testing.assert_allclose(np.asarray(by_ids)[real], np.asarray(by_mask)[real], atol=1e-6, rtol=0)


def test_fused_attention_equals_reference_unpacked_with_left_and_right_padding(small, highest_precision):
    cfg, params = small
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(3, 59, (3, 40)), jnp.int32)
    valid = np.ones((3, 40), bool)
    valid[0, :7] = False  # left padding
    valid[1, 31:] = False  # right padding
    pos = jnp.broadcast_to(jnp.cumsum(jnp.asarray(valid, jnp.int32), axis=1)[None], (3, 3, 40))
    ref = M.forward(params, cfg, ids, pos, jnp.asarray(valid))
    fused = M.forward(params, cfg.replace(attention="xla"), ids, pos, jnp.asarray(valid))
    np.testing.assert_allclose(np.asarray(fused)[valid], np.asarray(ref)[valid], atol=1e-5, rtol=0)


@pytest.mark.e2e
def test_vision_features_of_one_image_ignore_the_others_in_the_batch(small, highest_precision):
    """Two images packed in one call: changing image B's pixels leaves image A's features unchanged, under both
    attention implementations (block-diagonal attention, as Qwen2-VL's cu_seqlens)."""
    cfg, params = small
    rng = np.random.default_rng(3)
    grids = np.array([[1, 4, 4], [1, 4, 6]])
    pix_a = rng.normal(size=(16, cfg.vision.patch_dim)).astype(np.float32)
    pix_b = rng.normal(size=(24, cfg.vision.patch_dim)).astype(np.float32)
    pix_b2 = rng.normal(size=(24, cfg.vision.patch_dim)).astype(np.float32)
    for impl in ("reference", "xla"):
        c = cfg.replace(attention=impl)
        v1 = M.prepare_vision(c, np.concatenate([pix_a, pix_b]), grids, patch_buckets=(48,))
        v2 = M.prepare_vision(c, np.concatenate([pix_a, pix_b2]), grids, patch_buckets=(48,))
        f1, f2 = np.asarray(M.encode_images(params, c, v1)), np.asarray(M.encode_images(params, c, v2))
        np.testing.assert_allclose(f1[:4], f2[:4], atol=1e-6, rtol=0)  # image A: 16 patches = 4 merged tokens
        assert np.abs(f1[4:10] - f2[4:10]).max() > 1e-3  # image B did change
        alone = M.prepare_vision(c, pix_a, grids[:1], patch_buckets=(16,))
        np.testing.assert_allclose(np.asarray(M.encode_images(params, c, alone)), f1[:4], atol=1e-5, rtol=1e-5)


@pytest.mark.e2e
def test_gradients_are_the_same_under_every_remat_policy(small, highest_precision):
    """Decoder layers and vision blocks under each policy: one program computes the SFT gradients of all."""
    cfg, params = small
    cfg = cfg.replace(attention_query_chunk=0)  # one program for every policy: keep it small
    batch = sft.sft_model_batch(cfg, tiny_training_batch(cfg, 0))
    policies = [p for p in REMAT_POLICIES if p != "offload"]
    try:
        check_remat("offload", jax.default_backend())
        policies.append("offload")
    except ValueError:
        pass

    def grads(p):
        return [
            jax.grad(lambda q, r=r: sft.qwen2vl_sft_loss(cfg, remat=r, chunk=32)(q, batch, None)[0])(p)
            for r in policies
        ]

    base, *others = jax.jit(grads)(params)
    assert optax.tree.norm(base) > 1e-2 and optax.tree.norm(base["visual"]) > 1e-4
    for policy, got in zip(policies[1:], others):
        # recomputation regroups XLA's fusions: float32 rounding differences only (a few 1e-6 at most)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-4, err_msg=policy), base, got)


def test_unknown_remat_policy_is_one_line():
    with pytest.raises(
        ValueError,
        match=r"remat policy 'some' is unknown \(valid: none, full, dots_saveable, dots_no_batch, offload\)",
    ):
        check_remat("some", "cpu")
    with pytest.raises(ValueError, match=r"attention 'flash' is unknown \(valid: auto, reference, xla, cudnn\)"):
        tiny_cfg().replace(attention="flash")


@pytest.mark.e2e
def test_lora_inside_the_scan_equals_merged_weights(small, highest_precision):
    cfg, params = small
    cfg = cfg.replace(attention_query_chunk=0)
    batch = sft.sft_model_batch(cfg, tiny_training_batch(cfg, 1))
    opt = optax.sgd(0.1)
    state = tstate.create_train_state(params, opt, jax.random.PRNGKey(0), lora=LoraConfig(rank=4, alpha=8.0))
    # non-zero B, so the adapters change the model
    lora = jax.tree.map(lambda x: x + 0.05, state.params)
    loss = sft.qwen2vl_sft_loss(cfg, chunk=32)
    attached = tstate.loss_params(lora, state.frozen)
    assert "lora_a" in attached["model"]["layers"]["self_attn"]["q_proj"]  # rides into the layer scan
    merged_params = merge_lora(state.frozen, lora)
    q = merged_params["model"]["layers"]["self_attn"]["q_proj"]["kernel"]
    assert np.abs(np.asarray(q - params["model"]["layers"]["self_attn"]["q_proj"]["kernel"])).max() > 1e-3

    def both(lp):
        in_scan = jax.value_and_grad(lambda a: loss(tstate.loss_params(a, state.frozen), batch, None)[0])(lp)
        merged = jax.value_and_grad(lambda a: loss(merge_lora(state.frozen, a), batch, None)[0])(lp)
        return in_scan, merged

    (v_scan, g_scan), (v_merged, g_merged) = jax.jit(both)(lora)
    np.testing.assert_allclose(float(v_scan), float(v_merged), atol=1e-6, rtol=0)
    assert optax.tree.norm(g_merged) > 1e-3
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=1e-6, rtol=0), g_merged, g_scan)


@pytest.mark.e2e
@pytest.mark.parametrize("chunk", [0, 5, 8])
def test_reference_attention_backward_equals_autodiff_of_the_dense_softmax(chunk, highest_precision):
    """The reference path's own backward pass (saved row statistics, probabilities rebuilt per query chunk) gives
    autodiff's gradients of the plain masked softmax: grouped heads, packed segments with pads, a query with no
    allowed key, query chunks that do not divide T (17 = 3 x 6 - 1, 2 x 9 - 1)."""
    from ipl_jax.model.layers import _attention_dense, masked_attention

    rng = np.random.default_rng(3)
    b, t, hq, hkv, d = 2, 17, 4, 2, 8
    q, w = (jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.float32) for _ in range(2))
    seg = jnp.asarray([[0] * 6 + [1] * 5 + [2] * 4 + [-1] * 2, [-1] + [0] * 9 + [1] * 7], jnp.int32)
    mask = M.attention_mask_from_spec(seg)
    assert not np.asarray(mask)[1, 0].any()  # the leading pad attends to nothing

    def dense(q, k, v):
        return jnp.sum(_attention_dense(q, k, v, mask) * w)

    def blocked(q, k, v):
        out = masked_attention(q, k, v, lambda m, _: m, mask, None, query_chunk=chunk)
        return jnp.sum(out * w)

    want_v, want_g = jax.value_and_grad(dense, (0, 1, 2))(q, k, v)
    got_v, got_g = jax.jit(jax.value_and_grad(blocked, (0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(float(got_v), float(want_v), rtol=1e-5)  # exp * (1 / sum) vs a division
    assert all(float(jnp.abs(a).max()) > 0.1 for a in want_g)
    named = lambda grads: dict(zip(("dq", "dk", "dv"), grads, strict=True))
    assert_trees_close(named(got_g), named(want_g), rtol=1e-5, atol=2e-6)


def test_reference_attention_under_remat_keeps_no_whole_mask():
    """Layers under remat in a scan (as the decoder runs them): the gradient program holds a few [c, S] tensors of
    one query chunk, never the [T, S] mask of all chunks (computed ahead from the integer segment ids and kept,
    it alone would be 64 MiB of booleans here; measured with it: 83 MB of temporaries, without: 19 MB)."""
    from ipl_jax.model.layers import masked_attention, remat_body
    from ipl_jax.model.text import _spec_masks

    t, hq, hkv, d, chunk, layers = 4096, 4, 2, 8, 64, 3

    def loss(w, x, seg):  # the segment ids are an input of the program, as in a training step
        mask_of, per_query, per_key = _spec_masks(seg)

        def layer(h, wl):
            q = (h @ wl).reshape(1, t, hq, d)
            out = masked_attention(q, q[:, :, :hkv], q[:, :, hkv:], mask_of, per_query, per_key, query_chunk=chunk)
            return h + out.reshape(1, t, hq * d), None

        h, _ = jax.lax.scan(remat_body(layer, "full"), x, w)
        return jnp.sum(h * h)

    w = jax.ShapeDtypeStruct((layers, hq * d, hq * d), jnp.float32)
    x = jax.ShapeDtypeStruct((1, t, hq * d), jnp.float32)
    seg = jax.ShapeDtypeStruct((1, t), jnp.int32)
    temps = jax.jit(jax.grad(loss)).lower(w, x, seg).compile().memory_analysis().temp_size_in_bytes
    whole_mask = hq * t * t  # bytes of bool[H, T, S]
    assert temps < whole_mask / 2, (temps, whole_mask)


@pytest.mark.e2e
def test_model_gradients_of_the_reference_attention_equal_plain_autodiff(small, highest_precision):
    """The whole SFT gradient (decoder and vision tower, several query chunks) through the reference attention's
    own backward equals autodiff through XLA's attention ('xla': ``jax.nn.dot_product_attention``)."""
    cfg, params = small
    batch = sft.sft_model_batch(cfg, tiny_training_batch(cfg, 0))

    def grads(p):
        return [
            jax.grad(lambda q, c=c: sft.qwen2vl_sft_loss(c, chunk=32)(q, batch, None)[0])(p)
            for c in (cfg, cfg.replace(attention="xla"))
        ]

    ref, xla = jax.jit(grads)(params)
    assert optax.tree.norm(ref) > 1e-2 and optax.tree.norm(ref["visual"]) > 1e-4
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-4), xla, ref)


def test_attention_specs_known_answer():
    """A bool[B, T] spec stays the key-padding (causal) spec; an int32[B, T] one is read as segment ids."""
    seg = jnp.asarray([[0, 0, 1, 1, 2, -1]], jnp.int32)
    np.testing.assert_array_equal(M.attention_mask_from_spec(seg), PK.packed_attention_mask(seg))
    pad = jnp.asarray([[False, True, True, True, True, True]])
    want = np.tril(np.ones((6, 6), bool)) & np.asarray(pad)[:, None, :]
    np.testing.assert_array_equal(M.attention_mask_from_spec(pad), want)


def test_sft_loss_with_one_image_per_slot_equals_the_packed_images(small, highest_precision):
    """``sft_model_batch(..., image_patches=)`` lays images out one per slot (each encoded alone); the loss is
    the one of all images packed on one patch axis."""
    cfg, params = small
    tb = tiny_training_batch(cfg, 2, empty_rows=1)
    flat, slots = sft.sft_model_batch(cfg, tb), sft.sft_model_batch(cfg, tb, image_patches=24)
    assert flat["vision"].patches.shape == (96, cfg.vision.patch_dim)
    assert slots["vision"].patches.shape == (4, 24, cfg.vision.patch_dim)
    assert np.all(slots["vision"].segment_ids[3] == -1)  # the empty row's slot
    loss = jax.jit(lambda p, b: sft.qwen2vl_sft_loss(cfg, chunk=32)(p, b, None)[0])
    want, got = float(loss(params, flat)), float(loss(params, slots))
    assert want > 1.0
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.e2e
def test_fused_kernels_get_slot_lengths_and_whole_masks_with_the_reference_results(model_type, highest_precision):
    """The fused path hands ``jax.nn.dot_product_attention`` the arguments cuDNN gets on a GPU ('xla' takes the
    same ones): per-slot lengths for one screenshot per slot (Qwen2-VL), a whole segment mask for windows
    (Qwen2.5-VL), a [B, 1, T, T] mask with the causal hint in the decoder. The SFT loss and its gradients, with
    images one per slot and a slot left empty, equal the reference attention's."""
    cfg = tiny_cfg().replace(attention_query_chunk=16)
    if model_type == "qwen2_5_vl":  # 4-pixel windows (one merged token each) in block 0, the whole image in 1
        vision = dataclasses.replace(cfg.vision, depth=2, window_size=4, fullatt_block_indexes=(1,), hidden_act="silu")
        cfg = cfg.replace(model_type=model_type, vision=vision)
    params = numpy_params(cfg, std=0.3)
    batch = sft.sft_model_batch(cfg, tiny_training_batch(cfg, 2, empty_rows=1), image_patches=24)
    assert np.all(batch["vision"].segment_ids[3] == -1)

    def loss_and_grads(p):
        return [
            jax.value_and_grad(lambda q, c=c: sft.qwen2vl_sft_loss(c, chunk=32)(q, batch, None)[0])(p)
            for c in (cfg.replace(attention="reference"), cfg.replace(attention="xla"))
        ]

    (ref_loss, ref), (xla_loss, xla) = jax.jit(loss_and_grads)(params)
    assert float(ref_loss) > 1.0 and optax.tree.norm(ref["visual"]) > 1e-4
    np.testing.assert_allclose(float(xla_loss), float(ref_loss), atol=1e-5, rtol=0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4), xla, ref)


def test_attention_resolution_per_backend_and_one_line_refusals():
    """'auto' never fails (the reference off GPUs and for float32); 'cudnn' that cannot run names the setting and
    what works, before anything is traced."""
    from ipl_jax.model.layers import resolve_attention

    assert resolve_attention("auto", jnp.float32, (128,)) == "reference"
    assert resolve_attention("xla", jnp.float32) == "xla"
    if jax.default_backend() != "gpu":
        assert resolve_attention("auto", jnp.bfloat16, (128, 80)) == "reference"
        with pytest.raises(ValueError, match=r"^model.attention='cudnn' cannot run: it needs a GPU, this backend is "):
            resolve_attention("cudnn", jnp.bfloat16, (128,))
    with pytest.raises(ValueError, match=r"needs a bfloat16 or float16 compute dtype, the model computes in float32"):
        resolve_attention("cudnn", jnp.float32, (128,))
    with pytest.raises(ValueError, match=r"head dim 100 is not a multiple of 8 up to 128 \(use 'auto' or"):
        resolve_attention("cudnn", jnp.bfloat16, (100,))
    cfg = tiny_cfg().replace(attention="cudnn")
    params = numpy_params(tiny_cfg())
    ids = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="model.attention='cudnn' cannot run"):
        M.forward(params, cfg, ids, jnp.zeros((3, 1, 8), jnp.int32), jnp.ones((1, 8), bool))


@pytest.mark.e2e
def test_sampler_prompts_with_one_screenshot_per_slot_give_the_same_logits(sampler_model, highest_precision):
    """``SamplerConfig.image_patches``: each tree's screenshot in its own slot (encoded alone); the prefix's
    logits are those of the packed layout."""
    from support import EOS
    from support.sampler_models import random_step

    from ipl_jax.sampling.config import SamplerConfig
    from ipl_jax.sampling.prompts import pack_tree_prompts

    cfg, params = sampler_model
    rng = np.random.default_rng(1)
    steps = [
        random_step(rng, cfg, uid=7 + i, n_text=n, prompt_lens=(4, 3, 4), grid=g)
        for i, (n, g) in enumerate([(5, (1, 4, 4)), (9, (1, 4, 6))])
    ]
    base = SamplerConfig(eos_ids=(EOS,), prefix_buckets=(32,), prompt_buckets=(16,), patch_buckets=(64,))
    packed = pack_tree_prompts(cfg, steps, base, 3).prefix
    slots = pack_tree_prompts(cfg, steps, dataclasses.replace(base, image_patches=24), 3).prefix
    assert slots.vision.patches.shape[:2] == (2, 24)
    valid = np.asarray(packed.attention_mask)
    want, got = M.forward_inputs(params, cfg, packed), M.forward_inputs(params, cfg, slots)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-4, rtol=0)


def test_log_probs_of_needed_positions_skip_other_chunks_with_the_same_values_and_gradients(small):
    cfg, params = small
    rng = np.random.default_rng(3)
    hidden = jnp.asarray(rng.standard_normal((2, 64, cfg.text.hidden_size)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, cfg.text.vocab_size, (2, 64)), jnp.int32)
    needed = np.zeros((2, 64), bool)
    needed[0, 37:41] = True  # chunk 2 of 4 (16 positions each), one row only
    needed[1, 60:] = True  # chunk 3; chunks 0 and 1 are needed by no row and skip the vocabulary
    weights = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)

    def loss(p, h, need):
        lp = M.token_log_probs(p, cfg, h, targets, chunk=16, needed=need)
        return jnp.sum(jnp.where(needed, lp, 0.0) * weights), lp

    (v_skip, lp_skip), g_skip = jax.value_and_grad(loss, (0, 1), has_aux=True)(params, hidden, jnp.asarray(needed))
    (v_all, lp_all), g_all = jax.value_and_grad(loss, (0, 1), has_aux=True)(params, hidden, None)
    np.testing.assert_array_equal(np.asarray(lp_skip)[~needed], 0.0)
    assert np.all(np.asarray(lp_all)[~needed] < 0.0)  # the unmasked call computes every position
    np.testing.assert_allclose(np.asarray(lp_skip)[needed], np.asarray(lp_all)[needed], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(v_skip), float(v_all), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g_skip, g_all)
    assert np.abs(np.asarray(g_skip[1])[:, :32]).max() == 0.0  # no gradient reaches the skipped positions
