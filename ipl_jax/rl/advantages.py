"""Step-level advantages for online PPO (method.md §11) and GiGPPO's nearest-sibling features.

Asymmetric discounting: the terminal reward undiscounted, step rewards with γ_dense, one critic head per stream
(A_t = A^T_t + A^D_t); the value after the last step is 0. GiGPPO's sibling is the nearest state of another
trajectory of the same task by thumbnail distance (mean absolute difference in [0, 1]).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

SIBLING_FEATURES = 4  # (return of the terminal stream, of the dense stream, screen distance, has a sibling)


def stream_gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float, lam: float):
    """GAE of one reward stream. rewards, values: f32[B, S]; mask: bool[B, S] (a prefix of each row).
    Returns (advantages, λ-returns), both f32[B, S], 0 on padding."""
    m = jnp.asarray(mask, jnp.float32)
    r = jnp.asarray(rewards, jnp.float32) * m
    v = jnp.asarray(values, jnp.float32) * m
    v_next = jnp.concatenate([v[:, 1:] * m[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
    delta = r + gamma * v_next - v

    def back(carry, x):
        d, mk = x
        a = (d + gamma * lam * carry) * mk
        return a, a

    _, a = jax.lax.scan(back, jnp.zeros(r.shape[0]), (delta.T[::-1], m.T[::-1]))
    adv = a[::-1].T
    return adv, (adv + v) * m


def asymmetric_gae(
    step_rewards: jax.Array,
    terminal_reward: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma_dense: float = 0.5,
    lam: float = 1.0,
    gamma_terminal: float = 1.0,
):
    """Step-level GAE: step_rewards f32[B, S], terminal_reward f32[B], values f32[B, S, 2], mask bool[B, S] ->
    (advantages f32[B, S], returns f32[B, S, 2]).
    """
    m = jnp.asarray(mask, bool)
    n = jnp.sum(m.astype(jnp.int32), axis=1)
    last = (jnp.arange(m.shape[1])[None, :] == (n - 1)[:, None]) & m
    term = jnp.where(last, jnp.asarray(terminal_reward, jnp.float32)[:, None], 0.0)
    a_t, g_t = stream_gae(term, values[..., 0], m, gamma_terminal, lam)
    a_d, g_d = stream_gae(step_rewards, values[..., 1], m, gamma_dense, lam)
    return a_t + a_d, jnp.stack([g_t, g_d], axis=-1)


def stream_returns(
    step_rewards: jax.Array,
    terminal_reward: jax.Array,
    mask: jax.Array,
    gamma_dense: float = 0.5,
    gamma_terminal: float = 1.0,
) -> jax.Array:
    """Realised returns of both streams f32[B, S, 2] (λ = 1, zero values)."""
    zeros = jnp.zeros(jnp.shape(step_rewards) + (2,), jnp.float32)
    _, g = asymmetric_gae(step_rewards, terminal_reward, zeros, mask, gamma_dense, 1.0, gamma_terminal)
    return g


def normalise_advantages(adv: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(A − mean) / std over valid entries; a batch whose advantages are all equal gets zeros (never NaN)."""
    w = jnp.asarray(mask, jnp.float32)
    n = jnp.maximum(jnp.sum(w), 1.0)
    a = jnp.where(w > 0, adv, 0.0)
    mean = jnp.sum(a * w) / n
    std = jnp.sqrt(jnp.sum(((a - mean) ** 2) * w) / n)
    return jnp.where((w > 0) & (std > 1e-6), (a - mean) / (std + eps), 0.0)


# ------------------------------------------------------------------------------------------------ GiGPPO


def screen_thumbnail(image, size: tuple[int, int] = (16, 32)) -> np.ndarray:
    """A screen as a grey-scale thumbnail f32[W·H] in [0, 1] (PIL box filter: the area average)."""

    thumb = image.convert("L").resize(size, Image.BOX)
    return np.asarray(thumb, np.float32).reshape(-1) / 255.0


def screen_distance(a: jax.Array, b: jax.Array) -> jax.Array:
    """Mean absolute difference of thumbnails: f32[..., D] x f32[..., D] -> f32[...] in [0, 1]."""
    return jnp.mean(jnp.abs(a - b), axis=-1)


def nearest_siblings(thumbs: jax.Array, group: jax.Array, trajectory: jax.Array, valid: jax.Array):
    """For each state the nearest state of another trajectory of its group: (index, distance, has) [N] (ties: lowest
    index; none: has False).
    """
    d = screen_distance(thumbs[:, None, :], thumbs[None, :, :])
    ok = (
        (group[:, None] == group[None, :])
        & (trajectory[:, None] != trajectory[None, :])
        & valid[:, None]
        & valid[None, :]
    )
    d = jnp.where(ok, d, jnp.inf)
    index = jnp.argmin(d, axis=1).astype(jnp.int32)
    has = jnp.any(ok, axis=1)
    dist = jnp.where(has, jnp.take_along_axis(d, index[:, None], axis=1)[:, 0], 0.0)
    return jnp.where(has, index, 0), dist, has


def sibling_features(returns: jax.Array, index: jax.Array, distance: jax.Array, has: jax.Array) -> jax.Array:
    """GiGPPO's conditioning f32[N, 4]: the sibling's returns (terminal, dense), the distance, a has-sibling flag
    (zeros without one). returns: f32[N, 2]."""
    h = has.astype(jnp.float32)
    sib = jnp.take(returns, index, axis=0) * h[:, None]
    return jnp.concatenate([sib, (distance * h)[:, None], h[:, None]], axis=1)
