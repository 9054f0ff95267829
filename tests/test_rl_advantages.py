"""Step-level GAE with asymmetric discounting, GiGPPO's nearest siblings and the critic's conditioning: known
answers computed by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from ipl_jax.rl import advantages as A
from ipl_jax.rl import critic as C


def test_asymmetric_gae_lambda_one_is_return_minus_value():
    rewards = jnp.array([[1.0, 0.5, 1.0], [0.25, 1.0, 9.0]])
    terminal = jnp.array([2.0, 0.0])
    mask = jnp.array([[True, True, True], [True, True, False]])
    values = jnp.array([[[0.5, 0.2], [0.5, 0.1], [0.5, 0.0]], [[0.3, 0.1], [0.1, 0.4], [7.0, 7.0]]])
    adv, ret = A.asymmetric_gae(rewards, terminal, values, mask, gamma_dense=0.5, lam=1.0)
    # row 0: terminal stream 2 at every step (γ = 1); dense stream G2 = 1, G1 = 0.5 + 0.5·1, G0 = 1 + 0.5·1
    # row 1: failure (0); dense G1 = 1, G0 = 0.25 + 0.5·1; the padding step (reward 9) never counts
    np.testing.assert_allclose(np.asarray(ret[..., 0]), [[2, 2, 2], [0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret[..., 1]), [[1.5, 1.0, 1.0], [0.75, 1.0, 0]], atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(adv), [[3.5 - 0.7, 3.0 - 0.6, 3.0 - 0.5], [0.75 - 0.4, 1.0 - 0.5, 0]], atol=1e-6
    )
    np.testing.assert_allclose(np.asarray(A.stream_returns(rewards, terminal, mask, 0.5)), np.asarray(ret), atol=1e-6)


def test_stream_returns_add_up_to_the_asymmetric_return():
    """G_t = R_terminal + Σ_{k ≥ t} γ_dense^{k−t} r_k on valid steps, 0 on padding."""
    g = A.stream_returns(
        jnp.array([[1.0, 1.0, 1.0, 0.0]]), jnp.array([10.0]), jnp.array([[True, True, True, False]]), gamma_dense=0.5
    ).sum(-1)
    np.testing.assert_allclose(np.asarray(g[0]), [10 + 1 + 0.5 + 0.25, 10 + 1 + 0.5, 10 + 1, 0.0], rtol=1e-6)


def test_gae_lambda_half_by_hand():
    # dense stream, γ = 0.5, λ = 0.5: δ2 = 2 - 0.5, δ1 = 0 + 0.5·0.5 - 2, δ0 = 1 + 0.5·2 - 1;
    # A2 = 1.5, A1 = -1.75 + 0.25·1.5 = -1.375, A0 = 1 + 0.25·(-1.375) = 0.65625
    a, g = A.stream_gae(jnp.array([[1.0, 0.0, 2.0]]), jnp.array([[1.0, 2.0, 0.5]]), jnp.ones((1, 3), bool), 0.5, 0.5)
    np.testing.assert_allclose(np.asarray(a[0]), [0.65625, -1.375, 1.5], atol=1e-6)
    np.testing.assert_allclose(np.asarray(g[0]), [1.65625, 0.625, 2.0], atol=1e-6)
    # terminal stream (γ = 1) with success 1 at the last step, V_T = (0.2, 0.4, 0.6):
    # δ = (0.2, 0.2, 0.4); A2 = 0.4, A1 = 0.2 + 0.5·0.4, A0 = 0.2 + 0.5·0.4
    values = jnp.stack([jnp.array([[0.2, 0.4, 0.6]]), jnp.array([[1.0, 2.0, 0.5]])], axis=-1)
    adv, _ = A.asymmetric_gae(
        jnp.array([[1.0, 0.0, 2.0]]), jnp.array([1.0]), values, jnp.ones((1, 3), bool), gamma_dense=0.5, lam=0.5
    )
    np.testing.assert_allclose(np.asarray(adv[0]), [0.4 + 0.65625, 0.4 - 1.375, 0.4 + 1.5], atol=1e-6)


def test_asymmetric_discounting_makes_padding_unprofitable():
    """Ten steps of full step reward without success are worth less than two steps and a success at γ_dense =
    1/2; with an undiscounted dense stream the padded episode would win."""
    pad = jnp.ones((1, 10))
    fin = jnp.ones((1, 2))
    for gamma, padded_wins in ((0.5, False), (1.0, True)):
        g_pad = A.stream_returns(pad, jnp.array([0.0]), jnp.ones((1, 10), bool), gamma).sum(-1)[0, 0]
        g_fin = A.stream_returns(fin, jnp.array([1.0]), jnp.ones((1, 2), bool), gamma).sum(-1)[0, 0]
        assert bool(g_pad > g_fin) == padded_wins, (gamma, float(g_pad), float(g_fin))


def test_normalised_advantages_zero_for_a_flat_batch():
    a = A.normalise_advantages(jnp.array([[0.3, 0.3], [0.3, 5.0]]), jnp.array([[True, True], [True, False]]))
    np.testing.assert_array_equal(np.asarray(a), 0.0)
    b = np.asarray(A.normalise_advantages(jnp.array([[1.0, 3.0]]), jnp.ones((1, 2), bool)))
    np.testing.assert_allclose(b, [[-1.0, 1.0]], atol=1e-6)


def test_nearest_sibling_known_answer():
    thumbs = jnp.array([[0.0, 0.0], [1.0, 1.0], [0.2, 0.0], [0.9, 1.0], [0.0, 0.0], [0.5, 0.5], [0.0, 0.1]])
    group = jnp.array([0, 0, 0, 0, 1, 1, 0])
    traj = jnp.array([0, 0, 1, 1, 2, 2, 3])
    valid = jnp.array([True, True, True, True, True, True, False])  # state 6 (distance 0.05 to 0) is padding
    idx, dist, has = A.nearest_siblings(thumbs, group, traj, valid)
    # 0 -> 2 (0.1; 3 is 0.95), 1 -> 3 (0.05), 2 -> 0 (0.1), 3 -> 1 (0.05); group 1 has one trajectory only
    np.testing.assert_array_equal(np.asarray(idx), [2, 3, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(np.asarray(dist), [0.1, 0.05, 0.1, 0.05, 0, 0, 0], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(has), [True, True, True, True, False, False, False])
    returns = jnp.array([[1, 0.5], [1, 0.25], [0, 0.75], [0, 0.1], [1, 1], [1, 1], [5, 5]], jnp.float32)
    feats = np.asarray(A.sibling_features(returns, idx, dist, has))
    np.testing.assert_allclose(
        feats,
        [
            [0, 0.75, 0.1, 1],
            [0, 0.1, 0.05, 1],
            [1, 0.5, 0.1, 1],
            [1, 0.25, 0.05, 1],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
        ],
        atol=1e-6,
    )


def test_screen_thumbnail_distance():
    white = A.screen_thumbnail(Image.new("RGB", (224, 448), (255, 255, 255)))
    black = A.screen_thumbnail(Image.new("RGB", (224, 448), (0, 0, 0)))
    half = Image.new("RGB", (224, 448), (0, 0, 0))
    half.paste((255, 255, 255), (0, 0, 224, 224))
    assert white.shape == (16 * 32,)
    assert float(A.screen_distance(white, black)) == pytest.approx(1.0)
    assert float(A.screen_distance(white, white)) == 0.0
    assert float(A.screen_distance(A.screen_thumbnail(half), black)) == pytest.approx(0.5)


def test_critic_reads_the_sibling_return():
    """head(h) + sibling(h, φ): a hand-set sibling net that passes the sibling's terminal return through GELU."""
    h_dim, width = 2, 1
    critic = {
        "head": {"kernel": jnp.zeros((h_dim, 2)), "bias": jnp.array([0.1, 0.2])},
        "sibling": {
            "w1": jnp.zeros((h_dim + A.SIBLING_FEATURES, width)).at[h_dim, 0].set(1.0),
            "b1": jnp.zeros((width,)),
            "w2": jnp.array([[1.0, 0.0]]),
            "b2": jnp.zeros((2,)),
        },
    }
    h = jnp.array([[3.0, -1.0], [3.0, -1.0]])
    phi = jnp.array([[2.0, 0.5, 0.1, 1.0], [0.0, 0.0, 0.0, 0.0]])
    v = np.asarray(C.value_from_hidden(critic, h, phi))
    np.testing.assert_allclose(v, [[0.1 + float(jax.nn.gelu(2.0)), 0.2], [0.1, 0.2]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(C.value_from_hidden(critic, h, None)), [[0.1, 0.2]] * 2, atol=1e-6)
    # a fresh critic starts at zero with or without GiGPPO (its output layers are zero)
    from support.small_models import tiny_cfg

    cfg = tiny_cfg()
    fresh = C.init_critic({"w": jnp.ones(3)}, cfg, jax.random.PRNGKey(0), sibling_width=4)
    hh = jax.random.normal(jax.random.PRNGKey(1), (3, cfg.text.hidden_size))
    np.testing.assert_array_equal(np.asarray(C.value_from_hidden(fresh, hh, jnp.ones((3, 4)))), 0.0)
