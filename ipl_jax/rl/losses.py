"""Policy-gradient losses of the RL learners as pure functions of per-token log-probabilities (no model runs here):
GRPO (UI-R1) with its group advantages and DAST length reward, dual-clip PPO and the clipped value loss. Shapes:
``G`` groups of ``N`` samples, ``S`` sequences, ``T`` tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.preference.losses import masked_mean

# ------------------------------------------------------------------------------------------------- GRPO (UI-R1)


def group_advantages(rewards: jax.Array, eps: float = 1e-4) -> jax.Array:
    """GRPO advantages (r − mean) / (std + eps) within each group. rewards: f32[G, N] -> f32[G, N]."""
    mean = jnp.mean(rewards, axis=-1, keepdims=True)
    std = jnp.std(rewards, axis=-1, keepdims=True)
    return (rewards - mean) / (std + eps)


def k3_kl(policy_logps: jax.Array, ref_logps: jax.Array) -> jax.Array:
    """Per-token k3 KL estimator exp(ref − pol) − (ref − pol) − 1 (≥ 0)."""
    d = ref_logps - policy_logps
    return jnp.exp(d) - d - 1.0


def grpo_loss(
    policy_logps: jax.Array,
    old_logps: jax.Array,
    ref_logps: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_eps: float = 0.2,
    kl_beta: float = 0.04,
) -> tuple[jax.Array, dict]:
    """Token-level clipped policy loss with a k3 KL penalty (UI-R1), averaged over valid tokens.

    ``*_logps``: f32[S, T] per-token log-probs; ``advantages``: f32[S]; ``mask``: [S, T] valid response tokens.
    """
    ratio = jnp.exp(policy_logps - old_logps)
    adv = advantages[:, None]
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    kl = k3_kl(policy_logps, ref_logps)
    per_token = -(surrogate - kl_beta * kl)
    loss = masked_mean(per_token, mask)
    return loss, {
        "loss": loss,
        "kl": masked_mean(kl, mask),
        "clip_frac": masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask),
    }


def dast_length_reward(lengths: jax.Array, correct: jax.Array, max_length: float, p: float = 0.5) -> jax.Array:
    """DAST length reward (docs/method.md §11) for one group. lengths: f32[N] unpadded; correct: bool[N].

    L_budget = p·mean(L of correct) + (1 − p)·L_max (L_max when none is correct); λ = (L − L_budget)/L_budget;
    R = max(−0.5λ + 0.5, 0.1) if correct else min(0.9λ − 0.1, −0.1).
    """
    lengths = lengths.astype(jnp.float32)
    c = correct.astype(jnp.float32)
    n_correct = jnp.sum(c)
    mean_correct = jnp.where(n_correct > 0, jnp.sum(lengths * c) / jnp.maximum(n_correct, 1.0), max_length)
    budget = p * mean_correct + (1.0 - p) * max_length
    lam = (lengths - budget) / budget
    return jnp.where(correct, jnp.maximum(-0.5 * lam + 0.5, 0.1), jnp.minimum(0.9 * lam - 0.1, -0.1))


# ------------------------------------------------------------------------------------------ PPO with dense rewards


def ppo_dual_clip_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    eps_low: float = 0.18,
    eps_high: float = 0.22,
    dual_clip: float = 3.0,
) -> jax.Array:
    """Dual-clip PPO policy loss (asymmetric clip range), averaged over valid entries. All inputs share a shape."""
    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.minimum(ratio * advantages, jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages)
    dual = jnp.maximum(clipped, dual_clip * advantages)
    obj = jnp.where(advantages < 0, dual, clipped)
    return masked_mean(-obj, mask)


def clipped_value_loss(values, old_values, returns, mask, clip: float = 0.5) -> jax.Array:
    """PPO value loss with value clipping: 0.5·max((v − R)², (clip(v) − R)²)."""
    v_clip = old_values + jnp.clip(values - old_values, -clip, clip)
    loss = 0.5 * jnp.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return masked_mean(loss, mask)
