"""The T-DPO step is DPO as transformers' Qwen2-VL, Qwen3-VL and Qwen3-VL-MoE score it: per-continuation log-probs
from ``Qwen2VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` /
``Qwen3VLMoeForConditionalGeneration`` (images included, DeepStack and the routed experts too) for a policy and a
different reference, the sigmoid DPO loss and implicit rewards written out in numpy, against our
packed and unpacked steps (pair log-probs, per-pair loss and rewards, the step's loss, reward metrics and gradient
norm)."""

import jax
import numpy as np
import pytest
import torch
from support import EOS, FIRST_TEXT_ID, IMAGE, VISION_END, VISION_START
from support.hf_models import random_image, save_tiny, tiny_qwen3_model

from ipl_jax import model as M
from ipl_jax.preference import losses
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.preference import tdpo as ipl

BETA = 0.1
VOCAB = 1000
# β pairs (0 ≻ 1, 0 ≻ 2), a γ node (golden 3 ≻ each sampled), and a group whose chosen is its second continuation
PAIRS = [
    PB.PairRef(0, 0, 1, 1),
    PB.PairRef(0, 0, 2, 1),
    *(PB.PairRef(1, 3, k, 3) for k in range(3)),
    PB.PairRef(2, 1, 0, 2),
]


def make_groups(patch_dim: int):
    """Three prefixes (text, one screenshot of 4, 6 or 6 merged tokens, text) with 3, 4 and 2 continuations of
    2..6 random text tokens each closed by EOS."""
    rng = np.random.default_rng(0)
    text = lambda n: rng.integers(FIRST_TEXT_ID, VOCAB, n).tolist()
    groups = []
    for g, (grid, n_cont) in enumerate((((4, 4), 3), ((4, 6), 4), ((6, 4), 2))):
        pixels, thw = random_image(rng, grid, patch_dim)
        n_img = grid[0] * grid[1] // 4
        prefix = text(5) + [VISION_START] + [IMAGE] * n_img + [VISION_END] + text(7)
        conts = tuple(np.asarray(text(int(rng.integers(2, 7))) + [EOS], np.int32) for _ in range(n_cont))
        groups.append(
            PB.PrefixGroup(
                prefix_ids=np.asarray(prefix, np.int32),
                continuations=conts,
                pixel_values=pixels,
                image_grid_thw=np.asarray([thw]),
                name=f"g{g}",
            )
        )
    return groups


def hf_logps(model, group, cont, grad=False):
    """Summed log p(cont | prefix) under the transformers model, from one unpadded row [prefix + cont]: torch f32[]
    (differentiable when ``grad``)."""
    ids = torch.as_tensor(np.concatenate([group.prefix_ids, cont])[None].astype(np.int64))
    with torch.set_grad_enabled(grad):
        logits = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=torch.as_tensor(group.pixel_values),
            image_grid_thw=torch.as_tensor(group.image_grid_thw),
            mm_token_type_ids=(ids == IMAGE).long(),
        ).logits[0]
    start = len(group.prefix_ids) - 1  # the position whose logits predict the continuation's first token
    logp = torch.log_softmax(logits[start : start + len(cont)], dim=-1)
    return logp[torch.arange(len(cont)), torch.as_tensor(cont.astype(np.int64))].sum()


def hf_grad_norm(model, groups, want):
    """‖∇θ mean DPO loss‖ over every parameter of the transformers policy (reference log-probs fixed)."""
    ref_pos, ref_neg = (torch.as_tensor(x) for x in want["reference"])
    pos = torch.stack([hf_logps(model, groups[p.group], groups[p.group].continuations[p.pos], True) for p in PAIRS])
    neg = torch.stack([hf_logps(model, groups[p.group], groups[p.group].continuations[p.neg], True) for p in PAIRS])
    h = (pos.double() - ref_pos) - (neg.double() - ref_neg)
    torch.nn.functional.logsigmoid(BETA * h).neg().mean().backward()
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)))


# Qwen3-VL: DeepStack from blocks 0 and 1 (added after decoder layers 0 and 1), GQA 4:2, head_dim 16
QWEN3 = dict(
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    kv=2,
    head_dim=16,
    mrope=[2, 3, 3],
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=16),
    taps=[0, 1],
    tie=False,
    bias=False,
)
# Qwen3-VL-MoE: the same with every MLP 4 experts of width 32, two per token (the router's gradient flows through the
# renormalised top-2 weights)
QWEN3_MOE = dict(QWEN3, experts=dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32))
SHAPES = {"qwen3_vl": QWEN3, "qwen3_vl_moe": QWEN3_MOE}


def save_model(out_dir, family: str, seed: int):
    """(dir, transformers model) of a random tiny checkpoint of ``family``, saved by transformers."""
    if family == "qwen2_vl":
        return save_tiny(out_dir, seed=seed)
    model = tiny_qwen3_model(seed=seed, vocab=VOCAB, **SHAPES[family])
    model.save_pretrained(str(out_dir))
    return str(out_dir), model


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_vl", "qwen3_vl_moe"])
def setup(tmp_path_factory, request):
    """Policy and reference (two random tiny checkpoints of one family) in both frameworks, the groups, and
    transformers' chosen / rejected log-probs of every pair under each model (float64 numpy)."""
    policy_dir, policy_hf = save_model(tmp_path_factory.mktemp("policy"), request.param, seed=0)
    ref_dir, ref_hf = save_model(tmp_path_factory.mktemp("reference"), request.param, seed=1)
    params, cfg = M.load_params(policy_dir)
    ref_params, _ = M.load_params(ref_dir)
    groups = make_groups(cfg.vision.patch_dim)
    want = {}
    for name, model in (("policy", policy_hf), ("reference", ref_hf)):
        cont = {
            (g, i): float(hf_logps(model, grp, c))
            for g, grp in enumerate(groups)
            for i, c in enumerate(grp.continuations)
        }
        want[name] = (
            np.asarray([cont[(p.group, p.pos)] for p in PAIRS]),
            np.asarray([cont[(p.group, p.neg)] for p in PAIRS]),
        )
    out = dict(cfg=cfg, params=params, ref_params=ref_params, groups=groups, want=want)
    return {**out, "grad_norm": hf_grad_norm(policy_hf, groups, want)}


def numpy_dpo(want):
    """Per-pair sigmoid DPO loss −log σ(β[(πθ⁺ − πref⁺) − (πθ⁻ − πref⁻)]) and the implicit rewards β(πθ − πref)."""
    (pos, neg), (ref_pos, ref_neg) = want["policy"], want["reference"]
    chosen, rejected = BETA * (pos - ref_pos), BETA * (neg - ref_neg)
    return np.logaddexp(0.0, -(chosen - rejected)), chosen, rejected


def batches(cfg, groups, layout):
    """The pairs in one batch of the packed layout (a row per prefix) or the unpacked one (a row per
    continuation), both of one shape so that the step compiles once."""
    packing = PB.PackingConfig(rows=9, max_continuations=4, max_pairs=8, text_buckets=(64,), patch_buckets=(24,))
    if layout == "packed":
        return PK.pack_round(cfg, groups, PAIRS, packing)
    return PK.pack_unpacked(cfg, *PK.unpack_groups(groups, PAIRS), packing)


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["packed", "unpacked"])
def test_tdpo_step_is_dpo_on_transformers_log_probs(setup, layout):
    cfg, want, n = setup["cfg"], setup["want"], len(PAIRS)
    loss_np, chosen_np, rejected_np = numpy_dpo(want)
    assert np.ptp(loss_np) > 0.5 and np.abs(chosen_np - rejected_np).max() > 1.0  # far from log 2 everywhere
    config = ipl.TDPOConfig(model=cfg, dpo=losses.DPOSettings(beta=BETA, sft_weight=0.0), logp_chunk=16)
    with jax.default_matmul_precision("highest"):
        (batch,) = ipl.attach_reference(setup["ref_params"], batches(cfg, setup["groups"], layout), config).batches
        pos, neg = (np.asarray(x, np.float64)[:n] for x in ipl.reference_logps(setup["params"], batch, config))
        ref_pos, ref_neg = (np.asarray(x, np.float64)[:n] for x in (batch.ref_pos, batch.ref_neg))
        pair_loss, margin = losses.dpo_pair_losses(pos, neg, ref_pos, ref_neg, BETA)
        state = ipl.init_state(jax.tree.map(lambda x: x.copy(), setup["params"]), config, jax.random.PRNGKey(0))
        _, metrics = ipl.tdpo_step(state, batch, config)
    metrics = {k: float(v) for k, v in metrics.items()}
    # the continuations' summed log-probs: every scored token, the closing EOS included, none of the prefix
    np.testing.assert_allclose(pos, want["policy"][0], rtol=0, atol=2e-4)
    np.testing.assert_allclose(neg, want["policy"][1], rtol=0, atol=2e-4)
    np.testing.assert_allclose(ref_pos, want["reference"][0], rtol=0, atol=2e-4)
    np.testing.assert_allclose(ref_neg, want["reference"][1], rtol=0, atol=2e-4)
    # per pair: the sigmoid loss and the implicit rewards
    np.testing.assert_allclose(np.asarray(pair_loss), loss_np, rtol=0, atol=1e-4)
    np.testing.assert_allclose(BETA * (pos - ref_pos), chosen_np, rtol=0, atol=1e-4)
    np.testing.assert_allclose(BETA * (neg - ref_neg), rejected_np, rtol=0, atol=1e-4)
    np.testing.assert_allclose(np.asarray(margin), chosen_np - rejected_np, rtol=0, atol=1e-4)
    # the step: the mean over pairs of exactly these values, and the gradient of that mean
    assert metrics["pairs"] == n
    assert metrics["loss"] == pytest.approx(loss_np.mean(), abs=1e-4)
    assert metrics["pref_loss"] == pytest.approx(loss_np.mean(), abs=1e-4)
    assert metrics["reward_margin"] == pytest.approx((chosen_np - rejected_np).mean(), abs=1e-4)
    assert metrics["reward_accuracy"] == pytest.approx(np.mean(chosen_np > rejected_np))
    assert metrics["chosen_logratio"] == pytest.approx((chosen_np / BETA).mean(), abs=1e-3)
    assert metrics["rejected_logratio"] == pytest.approx((rejected_np / BETA).mean(), abs=1e-3)
    ours, theirs = metrics["grad_norm"], setup["grad_norm"]
    print(f"{cfg.hf_model_type} {layout}: |grad| {ours:.6g}, torch {theirs:.6g}, rel {abs(ours / theirs - 1):.2g}")
    assert metrics["grad_norm"] == pytest.approx(setup["grad_norm"], rel=1e-4)
