"""Preference losses as pure functions of per-sequence log-probabilities (no model runs here; the RL losses are in
``rl/losses``). Shapes: ``P`` pairs, ``T`` tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.preference.sections import LOSS_KINDS, SFT_NORMS, DPOSettings


def sum_logps(token_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum of log-probs over valid tokens. token_logps: f32[..., T], mask: bool/f32[..., T] -> f32[...]."""
    return jnp.sum(token_logps * mask.astype(token_logps.dtype), axis=-1)


def masked_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean of ``x`` over the valid entries (0 when none); ``valid``: bool/f32 of x's shape."""
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
    config: DPOSettings,
) -> tuple[jax.Array, dict]:
    """Thinking-level DPO plus an SFT term on the positive (docs/method.md §7), averaged over valid pairs.
    Inputs f32[P] summed over turn t's tokens; ``pos_tokens``: f32[P]; ``valid``: bool[P].
    """
    pair_loss, margin = dpo_pair_losses(policy_pos, policy_neg, ref_pos, ref_neg, config.beta, config.loss_kind)
    nll = positive_nll(policy_pos, pos_tokens, config.sft_norm)
    pref = masked_mean(pair_loss, valid)
    sft = masked_mean(nll, valid)
    loss = pref + config.sft_weight * sft
    metrics = {
        "loss": loss,
        "pref_loss": pref,
        "sft_nll": sft,
        "reward_margin": masked_mean(margin, valid),
        "reward_accuracy": masked_mean((margin > 0).astype(jnp.float32), valid),
        "chosen_logratio": masked_mean(policy_pos - ref_pos, valid),
        "rejected_logratio": masked_mean(policy_neg - ref_neg, valid),
        "pairs": jnp.sum(valid.astype(jnp.float32)),
    }
    return loss, metrics


def positive_sft_loss(
    policy_pos: jax.Array, pos_tokens: jax.Array, valid: jax.Array, norm: str = "token"
) -> tuple[jax.Array, dict]:
    """ "IPL without negatives": the NLL of the positive continuations only (``positive_nll``'s normalisation)."""
    nll = masked_mean(positive_nll(policy_pos, pos_tokens, norm), valid)
    return nll, {"loss": nll, "sft_nll": nll, "pairs": jnp.sum(valid.astype(jnp.float32))}
