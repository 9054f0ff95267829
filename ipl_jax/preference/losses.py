"""Preference and policy-gradient losses as pure functions of per-sequence / per-token log-probabilities
(no model runs here). Shapes: ``P`` pairs, ``G`` groups of ``N`` samples, ``T`` tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.preference.sections import LOSS_KINDS, SFT_NORMS, DPOConfig


def sum_logps(token_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum of log-probs over valid tokens. token_logps: f32[..., T], mask: bool/f32[..., T] -> f32[...]."""
    return jnp.sum(token_logps * mask.astype(token_logps.dtype), axis=-1)


def _masked_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
    w = valid.astype(jnp.float32)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def positive_nll(policy_pos: jax.Array, pos_tokens: jax.Array, norm: str = "token") -> jax.Array:
    """NLL of each positive continuation f32[P]: per token (``norm="token"``) or summed over the turn (``"sum"``)."""
    if norm == "token":
        return -policy_pos / jnp.maximum(pos_tokens, 1.0)
    if norm == "sum":
        return -policy_pos
    raise ValueError(f"unknown SFT normalisation {norm!r}; expected one of {SFT_NORMS}")


def dpo_pair_losses(
    policy_pos: jax.Array,
    policy_neg: jax.Array,
    ref_pos: jax.Array,
    ref_neg: jax.Array,
    beta: float,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """Per-pair DPO loss and implicit reward margin β·[(πθ⁺ − πref⁺) − (πθ⁻ − πref⁻)]: inputs f32[P] summed
    log-probs; returns (loss f32[P], margin f32[P]).
    """
    h = (policy_pos - ref_pos) - (policy_neg - ref_neg)
    margin = beta * h
    if kind == "sigmoid":
        loss = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(margin) - label_smoothing * jax.nn.log_sigmoid(-margin)
    elif kind == "ipo":
        loss = (h - 1.0 / (2.0 * beta)) ** 2
    elif kind == "hinge":
        loss = jax.nn.relu(1.0 - margin)
    else:
        raise ValueError(f"unknown DPO loss kind {kind!r}; expected one of {LOSS_KINDS}")
    return loss, margin


def tdpo_loss(
    policy_pos: jax.Array,
    policy_neg: jax.Array,
    ref_pos: jax.Array,
    ref_neg: jax.Array,
    pos_tokens: jax.Array,
    valid: jax.Array,
    config: DPOConfig,
) -> tuple[jax.Array, dict]:
    """Thinking-level DPO plus an SFT term on the positive (docs/method.md §7), averaged over valid pairs.
    Inputs f32[P] summed over turn t's tokens; ``pos_tokens``: f32[P]; ``valid``: bool[P].
    """
    pair_loss, margin = dpo_pair_losses(policy_pos, policy_neg, ref_pos, ref_neg, config.beta, config.loss_kind)
    nll = positive_nll(policy_pos, pos_tokens, config.sft_norm)
    pref = _masked_mean(pair_loss, valid)
    sft = _masked_mean(nll, valid)
    loss = pref + config.sft_weight * sft
    metrics = {
        "loss": loss,
        "pref_loss": pref,
        "sft_nll": sft,
        "reward_margin": _masked_mean(margin, valid),
        "reward_accuracy": _masked_mean((margin > 0).astype(jnp.float32), valid),
        "chosen_logratio": _masked_mean(policy_pos - ref_pos, valid),
        "rejected_logratio": _masked_mean(policy_neg - ref_neg, valid),
        "pairs": jnp.sum(valid.astype(jnp.float32)),
    }
    return loss, metrics


def positive_sft_loss(
    policy_pos: jax.Array, pos_tokens: jax.Array, valid: jax.Array, norm: str = "token"
) -> tuple[jax.Array, dict]:
    """ "IPL without negatives": the NLL of the positive continuations only (``positive_nll``'s normalisation)."""
    nll = _masked_mean(positive_nll(policy_pos, pos_tokens, norm), valid)
    return nll, {"loss": nll, "sft_nll": nll, "pairs": jnp.sum(valid.astype(jnp.float32))}


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
    loss = _masked_mean(per_token, mask)
    return loss, {
        "loss": loss,
        "kl": _masked_mean(kl, mask),
        "clip_frac": _masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask),
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


def dense_returns(step_rewards: jax.Array, terminal_reward: jax.Array, mask: jax.Array, gamma_dense: float = 0.5):
    """Returns G_t = R_terminal + Σ_{k ≥ t} γ_dense^{k−t} r_k f32[B, S] (0 on padding). step_rewards: f32[B, S];
    terminal_reward: f32[B]; mask: bool[B, S].
    """
    m = mask.astype(jnp.float32)
    r = step_rewards * m

    def back(carry, x):
        rk, mk = x
        g = rk + gamma_dense * carry * mk
        return g, g

    _, g = jax.lax.scan(back, jnp.zeros(r.shape[0]), (r.T[::-1], m.T[::-1]))
    dense = g[::-1].T
    return (dense + terminal_reward[:, None]) * m


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
    return _masked_mean(-obj, mask)


def clipped_value_loss(values, old_values, returns, mask, clip: float = 0.5) -> jax.Array:
    """PPO value loss with value clipping: 0.5·max((v − R)², (clip(v) − R)²)."""
    v_clip = old_values + jnp.clip(values - old_values, -clip, clip)
    loss = 0.5 * jnp.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return _masked_mean(loss, mask)
