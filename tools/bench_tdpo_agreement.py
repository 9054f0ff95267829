"""The agreement mode of tools.bench_tdpo (``--agreement``): our T-DPO step against TRL's ``DPOTrainer``.

The policy and a reference that differs from it (the policy's weights plus Gaussian noise) score the same
pairs three ways: our packed step, our unpacked step (one row per continuation) and TRL. For every pair: the
sigmoid DPO loss and the implicit rewards β·(log π − log π_ref) of the chosen and rejected continuation; over all
pairs: the gradient of the mean DPO loss (SFT weight 0) with respect to every trained parameter. Ours come from
``tdpo.pair_terms`` / ``losses.dpo_pair_losses`` (per pair) and ``jax.grad`` of ``tdpo.make_tdpo_loss`` (the
loss the step differentiates), the reference log-probs from ``tdpo.attach_reference``. Everything runs in
float32 at the highest matmul precision, so what differs is the implementation, not rounding.

``run_agreement`` returns the ``trl_agreement`` JSON (per-pair values, max |Δ| per quantity, gradient cosine and
the largest relative difference of any leaf, pass / fail against the targets); ``print_agreement`` prints it.
"""

from __future__ import annotations

import jax
import numpy as np

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.preference import losses
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.preference import tdpo as ipl
from tools.bench_tdpo_trl import trl_agreement_side

LOSS_TARGET = 1e-4  # max |Δ per-pair loss|
COSINE_TARGET = 0.9999  # gradient cosine over all trained parameters
PER_PAIR = ("loss", "chosen_reward", "rejected_reward")
COMPARISONS = (("packed", "trl"), ("unpacked", "trl"), ("packed", "unpacked"))


def perturbed(params, key, std: float):
    """``params`` + N(0, std²) on every leaf (explicit key): a reference that differs from the policy."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    noisy = [x + std * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(tree, noisy)


def our_side(params, ref_params, batch: PB.PackedBatch, config: ipl.TDPOConfig) -> dict:
    """Per-pair loss and implicit rewards f64[P] and the gradient of the step's loss on one batch that holds every
    pair (in order)."""
    cfg, beta = config.model, config.dpo.beta
    (batch,) = ipl.attach_reference(ref_params, [batch], config).batches
    n = batch.num_pairs
    terms = jax.jit(lambda p, b: ipl.pair_terms(p, cfg, b, chunk=config.logp_chunk))
    pos, neg, _ = terms(params, batch)
    pair_loss, _ = losses.dpo_pair_losses(pos, neg, batch.ref_pos, batch.ref_neg, beta, config.dpo.loss_kind)
    loss_fn = ipl.make_tdpo_loss(config)
    grad_fn = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, None), has_aux=True))
    (loss, _), grads = grad_fn(params, batch)
    as_np = lambda x: np.asarray(x, np.float64)[:n]
    return {
        "loss": as_np(pair_loss),
        "chosen_reward": beta * (as_np(pos) - as_np(batch.ref_pos)),
        "rejected_reward": beta * (as_np(neg) - as_np(batch.ref_neg)),
        "batch_loss": float(loss),
        "grads": grads,
    }


def gradient_agreement(a, b) -> dict:
    """Cosine of two gradient trees over all leaves, and the largest relative difference ‖a − b‖ / ‖b‖ of any
    leaf (with its path)."""
    flat_a, flat_b = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)
    dot = norm_a = norm_b = 0.0
    worst, worst_leaf = 0.0, ""
    for (path, x), y in zip(flat_a, flat_b):
        x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
        dot, norm_a, norm_b = dot + x @ y, norm_a + x @ x, norm_b + y @ y
        rel = float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))
        if rel >= worst:
            worst, worst_leaf = rel, jax.tree_util.keystr(path)
    return {
        "cosine": float(dot / np.sqrt(norm_a * norm_b)),
        "max_leaf_rel_diff": worst,
        "max_leaf": worst_leaf,
        "norm_ratio": float(np.sqrt(norm_a / norm_b)),
    }


def run_agreement(cfg: Qwen2VLConfig, params, groups, pairs, *, beta: float, ref_noise: float, key, tmp: str):
    """The ``trl_agreement`` dict for ``pairs`` of ``groups`` (one batch), the reference ``perturbed(params, key,
    ref_noise)``."""
    ref_params = perturbed(params, key, ref_noise)
    config = ipl.TDPOConfig(model=cfg, dpo=losses.DPOSettings(beta=beta, sft_weight=0.0), logp_chunk=64)
    n = len(pairs)
    buckets = tuple(range(64, 8193, 64))
    patches = max(int(np.prod(g.image_grid_thw)) for g in groups)
    packing = lambda rows, conts: PB.PackingConfig(
        rows=rows, max_continuations=conts, max_pairs=n, text_buckets=buckets, patch_buckets=(patches,)
    )
    (packed,) = PK.pack_round(cfg, groups, pairs, packing(len(groups), max(len(g.continuations) for g in groups)))
    ugroups, upairs = PK.unpack_groups(groups, pairs)
    (unpacked,) = PK.pack_unpacked(cfg, ugroups, upairs, packing(len(ugroups), 1))
    sides = {name: our_side(params, ref_params, b, config) for name, b in (("packed", packed), ("unpacked", unpacked))}
    trl = trl_agreement_side(cfg, params, ref_params, groups, pairs, beta, tmp)
    out = {
        "pairs": n,
        "beta": beta,
        "reference": f"policy + N(0, {ref_noise}^2) on every weight",
        "precision": "float32, highest matmul precision",
        "targets": {"max_abs_loss_diff": LOSS_TARGET, "grad_cosine": COSINE_TARGET},
    }
    if "skipped" in trl:
        out["trl"] = {"skipped": trl["skipped"]}
    else:
        sides["trl"] = trl
    out["per_pair"] = {name: {k: side[k].tolist() for k in PER_PAIR} for name, side in sides.items()}
    out["batch_loss"] = {name: side["batch_loss"] for name, side in sides.items()}
    out["comparisons"] = {}
    ok = "trl" in sides
    for a, b in COMPARISONS:
        if a not in sides or b not in sides:
            continue
        sa, sb = sides[a], sides[b]
        row = {f"max_abs_{k}_diff": float(np.max(np.abs(sa[k] - sb[k]))) for k in PER_PAIR}
        row["batch_loss_diff"] = abs(sa["batch_loss"] - sb["batch_loss"])
        row["grad"] = gradient_agreement(sa["grads"], sb["grads"])
        row["pass"] = row["max_abs_loss_diff"] <= LOSS_TARGET and row["grad"]["cosine"] >= COSINE_TARGET
        ok = ok and row["pass"]
        out["comparisons"][f"{a}_vs_{b}"] = row
    out["pass"] = ok
    return out


def print_agreement(agreement: dict) -> None:
    print(
        f"\nagreement with TRL ({agreement['pairs']} pairs, beta {agreement['beta']}, reference: "
        f"{agreement['reference']}; {agreement['precision']})"
    )
    per_pair = agreement["per_pair"]
    names = list(per_pair)
    print(f"{'pair':>4s} " + " ".join(f"{n + ' ' + q:>20s}" for n in names for q in ("loss",)), end="")
    print(" " + " ".join(f"{n + ' r+':>14s} {n + ' r-':>14s}" for n in names))
    for k in range(agreement["pairs"]):
        cells = [f"{per_pair[n]['loss'][k]:20.8f}" for n in names]
        rewards = [f"{per_pair[n]['chosen_reward'][k]:14.6f} {per_pair[n]['rejected_reward'][k]:14.6f}" for n in names]
        print(f"{k:4d} " + " ".join(cells) + " " + " ".join(rewards))
    if "trl" in agreement:
        print(f"TRL did not run: {agreement['trl']['skipped']}")
    for name, row in agreement["comparisons"].items():
        g = row["grad"]
        print(
            f"{name:20s} max|Δloss| {row['max_abs_loss_diff']:.2e}  max|Δr+| {row['max_abs_chosen_reward_diff']:.2e}  "
            f"max|Δr-| {row['max_abs_rejected_reward_diff']:.2e}  |Δbatch loss| {row['batch_loss_diff']:.2e}  "
            f"grad 1-cosine {1 - g['cosine']:.1e}  max leaf rel diff {g['max_leaf_rel_diff']:.2e} ({g['max_leaf']})  "
            f"{'PASS' if row['pass'] else 'FAIL'}"
        )
    print(
        f"targets: max|Δ per-pair loss| <= {LOSS_TARGET:g}, gradient cosine >= {COSINE_TARGET}: "
        f"{'met' if agreement['pass'] else 'NOT met'}"
    )
