import math

import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.preference import losses


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_tdpo_matches_direct_formula_with_and_without_sft():
    pp, pn, rp, rn = [-3.0, -1.0, -2.0], [-4.0, -0.5, -9.0], [-3.5, -1.2, -2.0], [-3.8, -0.7, -1.0]
    ntok = [3.0, 2.0, 5.0]
    valid = [True, True, False]
    for lam in (0.0, 1.0):
        cfg = losses.DPOConfig(beta=0.1, sft_weight=lam)
        loss, m = losses.tdpo_loss(*(jnp.array(v) for v in (pp, pn, rp, rn, ntok)), jnp.array(valid), cfg)
        want_pref = np.mean([-math.log(_sig(0.1 * ((pp[i] - rp[i]) - (pn[i] - rn[i])))) for i in (0, 1)])
        want_sft = np.mean([-pp[i] / ntok[i] for i in (0, 1)])
        assert float(loss) == pytest.approx(want_pref + lam * want_sft, rel=1e-6)
        assert float(m["pairs"]) == 2.0
        assert float(m["reward_accuracy"]) == pytest.approx(1.0)


def test_dpo_variants_known_values():
    args = [jnp.array([v]) for v in (-1.0, -2.0, -1.5, -1.5)]  # h = 0.5 - (-0.5) = 1.0
    l, margin = losses.dpo_pair_losses(*args, beta=0.5, kind="sigmoid")
    assert float(margin[0]) == pytest.approx(0.5)
    assert float(l[0]) == pytest.approx(-math.log(_sig(0.5)), rel=1e-6)
    l, _ = losses.dpo_pair_losses(*args, beta=0.5, kind="ipo")
    assert float(l[0]) == pytest.approx((1.0 - 1.0) ** 2)
    l, _ = losses.dpo_pair_losses(*args, beta=0.5, kind="hinge")
    assert float(l[0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        losses.dpo_pair_losses(*args, beta=0.5, kind="nope")


def test_group_advantages_and_k3():
    r = jnp.array([[1.0, 0.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    a = losses.group_advantages(r)
    np.testing.assert_allclose(np.asarray(a[0]), [0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001, -0.5 / 0.5001], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(a[1]), 0.0)
    kl = losses.k3_kl(jnp.array([-1.0, -2.0]), jnp.array([-1.0, -1.0]))
    assert float(kl[0]) == 0.0
    assert float(kl[1]) == pytest.approx(math.exp(1.0) - 1.0 - 1.0)


def test_grpo_loss_unclipped_equals_minus_advantage_at_ratio_one():
    lp = jnp.array([[-1.0, -2.0, 0.0]])
    loss, m = losses.grpo_loss(lp, lp, lp, jnp.array([2.0]), jnp.array([[1, 1, 0]]), kl_beta=0.04)
    assert float(loss) == pytest.approx(-2.0)
    assert float(m["kl"]) == 0.0


def test_dast_length_reward_branches():
    lengths = jnp.array([10.0, 30.0, 20.0, 40.0])
    correct = jnp.array([True, True, False, False])
    r = np.asarray(losses.dast_length_reward(lengths, correct, max_length=40.0, p=0.5))
    budget = 0.5 * 20.0 + 0.5 * 40.0  # 30
    lam = (np.array([10, 30, 20, 40]) - budget) / budget
    want = [
        max(-0.5 * lam[0] + 0.5, 0.1),
        max(-0.5 * lam[1] + 0.5, 0.1),
        min(0.9 * lam[2] - 0.1, -0.1),
        min(0.9 * lam[3] - 0.1, -0.1),
    ]
    np.testing.assert_allclose(r, want, rtol=1e-6)


def test_dense_returns_asymmetric_discount():
    g = losses.dense_returns(
        jnp.array([[1.0, 1.0, 1.0, 0.0]]), jnp.array([10.0]), jnp.array([[True, True, True, False]]), gamma_dense=0.5
    )
    np.testing.assert_allclose(np.asarray(g[0]), [10 + 1 + 0.5 + 0.25, 10 + 1 + 0.5, 10 + 1, 0.0], rtol=1e-6)


def test_ppo_dual_clip():
    # positive advantage, ratio above 1+eps_high: clipped
    l = losses.ppo_dual_clip_loss(jnp.log(jnp.array([2.0])), jnp.zeros(1), jnp.array([1.0]), jnp.ones(1, bool))
    assert float(l) == pytest.approx(-1.22, rel=1e-6)
    # negative advantage with a huge ratio: bounded by dual clip c·A
    l = losses.ppo_dual_clip_loss(jnp.log(jnp.array([10.0])), jnp.zeros(1), jnp.array([-1.0]), jnp.ones(1, bool))
    assert float(l) == pytest.approx(3.0, rel=1e-6)
    v = losses.clipped_value_loss(jnp.array([2.0]), jnp.array([0.0]), jnp.array([0.0]), jnp.ones(1, bool))
    assert float(v) == pytest.approx(0.5 * 4.0)
