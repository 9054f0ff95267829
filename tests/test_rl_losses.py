"""GRPO's group advantages, the k3 KL, the GRPO and dual-clip PPO losses, the clipped value loss and DAST's length
reward: known answers computed by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.rl import losses


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


def test_ppo_dual_clip():
    # positive advantage, ratio above 1+eps_high: clipped
    l = losses.ppo_dual_clip_loss(jnp.log(jnp.array([2.0])), jnp.zeros(1), jnp.array([1.0]), jnp.ones(1, bool))
    assert float(l) == pytest.approx(-1.22, rel=1e-6)
    # negative advantage with a huge ratio: bounded by dual clip c·A
    l = losses.ppo_dual_clip_loss(jnp.log(jnp.array([10.0])), jnp.zeros(1), jnp.array([-1.0]), jnp.ones(1, bool))
    assert float(l) == pytest.approx(3.0, rel=1e-6)
    v = losses.clipped_value_loss(jnp.array([2.0]), jnp.array([0.0]), jnp.array([0.0]), jnp.ones(1, bool))
    assert float(v) == pytest.approx(0.5 * 4.0)
