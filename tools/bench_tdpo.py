"""Benchmark: T-DPO training throughput (pairs/s), prefix-packed vs unpacked vs TRL's DPOTrainer.

One run, one process, the same random weights (fp32) and the same preference pairs for all three:

  (a) packed: ``ipl.tdpo_step`` on ``packing.pack_round`` batches — one row per prefix node holding the prefix
      once and every continuation of it (β: 3 sibling actions, 2 pairs; γ: the golden action + 3 sampled
      ones, 3 pairs);
  (b) unpacked: the same step on ``packing.pack_unpacked`` batches — one row per (prefix, continuation), the
      prefix (screenshot included) repeated for every continuation;
  (c) TRL: ``DPOTrainer.training_step`` + its AdamW step on a ``Qwen2VLForConditionalGeneration`` loaded from
      the same weights (``save_params``), fed pre-tokenised rows in TRL's own layout (prompt + chosen, then prompt
      + rejected: two rows per pair, left-flushed, with ``completion_mask``); TRL runs its frozen reference model
      inside every step.

Our reference log-probs are computed once per round (``ipl.attach_reference``), one forward per batch; the
headline ratios therefore compare step + reference time per batch for (a)/(b) with TRL's step, which does
both. Step-only numbers are printed too. JAX programs are compiled ahead of time (``.lower().compile()``) and
not timed; the variants take turns, each running every batch once per round for ``--repeats`` rounds, and the
median is reported.

``--agreement`` runs instead the agreement check of ``bench_tdpo_agreement``: per-pair sigmoid DPO loss, implicit
rewards and the DPO gradient of the packed step, the unpacked step and TRL, with a reference that differs from the
policy, in float32 at the highest matmul precision; printed, and written to ``--json`` as ``trl_agreement``.

TRL comes with the test extra (``pip install -c constraints.txt -e ".[test]"``; ``.[bench]`` adds it alone), not
with the package. It runs if importable; otherwise the TRL row (or the agreement's ``trl`` entry) says why it did not
run. ``tests/test_tools.py`` runs both modes with ``--tiny``.

    python -m tools.bench_tdpo [--quick | --tiny] [--groups G] [--batches N] [--repeats R] [--json OUT] [--skip-trl]
    python -m tools.bench_tdpo --agreement [--quick | --tiny] [--groups G] [--ref-noise S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import jax
import numpy as np

from ipl_jax import model as M
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import count_params
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.preference import tdpo as ipl
from tools import harness
from tools.bench_models import bench_model, bench_shape
from tools.bench_tdpo_agreement import print_agreement, run_agreement
from tools.bench_tdpo_trl import make_trl

# name -> model sizes and prefix / continuation lengths. "default": ~50M parameters, 529 image tokens per step;
# the prefix of a turn-3 pair is the screenshot, prompts and the sampled s1, s2 (~730 tokens).
SHAPES = {
    "default": bench_shape("53m", prompts=(40, 28), turns=(48, 48), action=(8, 16)),
    "quick": bench_shape("1m", prompts=(16, 12), turns=(16, 16), action=(4, 8)),
    "tiny": bench_shape("tiny", prompts=(4, 3), turns=(4, 4), action=(2, 4)),
}
TEXT_BUCKETS = tuple(range(64, 4097, 64))


def make_workload(cfg: Qwen2VLConfig, s: dict, groups_per_batch: int, n_batches: int, rng: np.random.Generator):
    """Groups alternate β (3 sampled actions; pairs 0≻1, 0≻2) and γ (golden + 3 sampled; golden ≻ each).
    Returns a list of (groups, pairs) per batch; every batch has the same number of groups and pairs."""
    t, h, w = s["grid"]
    eot = cfg.text.eos_token_id[0]
    text = lambda k: rng.integers(10, cfg.image_token_id - 10, k).tolist()
    out = []
    for _ in range(n_batches):
        groups, pairs = [], []
        for g in range(groups_per_batch):
            prefix = harness.random_prefix(cfg, s, rng)
            for turn_len, prompt_len in zip(s["turns"], s["prompts"]):
                prefix += text(turn_len - 1) + [eot] + text(prompt_len)
            n_cont = 3 if g % 2 == 0 else 4
            conts = tuple(np.asarray(text(int(rng.integers(*s["action"]))) + [eot], np.int32) for _ in range(n_cont))
            groups.append(
                PB.PrefixGroup(
                    prefix_ids=np.asarray(prefix, np.int32),
                    continuations=conts,
                    pixel_values=rng.standard_normal((t * h * w, cfg.vision.patch_dim)).astype(np.float32),
                    image_grid_thw=np.asarray([[t, h, w]], np.int64),
                    name=f"bench group {g}",
                )
            )
            pairs += (
                [PB.PairRef(g, 0, 1, 3), PB.PairRef(g, 0, 2, 3)]
                if n_cont == 3
                else [PB.PairRef(g, 0, k, 3) for k in (1, 2, 3)]
            )
        out.append((groups, pairs))
    return out


def batch_tokens(batch: PB.PackedBatch) -> tuple[int, int]:
    """(real tokens, padded tokens) fed to the model by one packed batch."""
    seg = np.asarray(batch.segment_ids)
    return int(np.sum(seg >= 0)), int(seg.size)


def median(xs):
    return float(np.median(np.asarray(xs)))


# ------------------------------------------------------------------------------------------------ JAX variants


class JaxVariant:
    """One T-DPO step and one reference forward per batch (both compiled ahead of time, not timed); ``round()``
    times each batch once, ``result()`` reports the medians."""

    def __init__(self, name: str, params, config: ipl.TDPOConfig, batches):
        self.name, self.params, self.batches = name, params, list(batches)
        # the step donates its state: train a copy, so that ``params`` stays the shared starting point
        self.state = ipl.init_state(jax.tree.map(lambda x: x.copy(), params), config, jax.random.PRNGKey(0))
        t0 = time.perf_counter()
        self.step_exec = ipl.lower_tdpo_step(self.state, self.batches[0], config).compile()
        self.ref_exec = ipl.reference_jit.lower(params, self.batches[0], config.model, False, config.logp_chunk)
        self.ref_exec = self.ref_exec.compile()
        self.compile_s = time.perf_counter() - t0
        self.ref_times, self.step_times, self.with_ref = [], [], [None] * len(self.batches)

    def round(self):
        for i, batch in enumerate(self.batches):
            (rp, rn), seconds = harness.timed(self.ref_exec, self.params, batch)
            self.ref_times.append(seconds)
            if self.with_ref[i] is None:
                self.with_ref[i] = batch.with_reference(np.asarray(rp), np.asarray(rn))
            (self.state, self.metrics), seconds = harness.timed(self.step_exec, self.state, self.with_ref[i])
            self.step_times.append(seconds)

    def result(self) -> dict:
        first = self.with_ref[0]
        pairs = first.num_pairs
        real, padded = batch_tokens(first)
        step_s, ref_s = median(self.step_times), median(self.ref_times)
        return {
            "variant": self.name,
            "rows": first.rows,
            "T": first.length,
            "pairs_per_step": pairs,
            "tokens_per_pair": real / pairs,
            "padded_tokens_per_pair": padded / pairs,
            "step_s": step_s,
            "reference_s": ref_s,
            "pairs_per_s": pairs / (step_s + ref_s),
            "pairs_per_s_step_only": pairs / step_s,
            "compile_s": self.compile_s,
            "loss": float(self.metrics["loss"]),
            "step_times": self.step_times,
            "_first_ref": (np.asarray(first.ref_pos)[:pairs], np.asarray(first.ref_neg)[:pairs]),
        }


def pack_layouts(cfg: Qwen2VLConfig, s: dict, workload, groups: int) -> tuple[list, list]:
    """The workload's batches in both layouts: packed (``pack_round``: one row per prefix group, ``groups`` rows) and
    unpacked (``pack_unpacked``: one row per (prefix, continuation)); every row's patch slot holds one screenshot."""
    n_pairs = len(workload[0][1])
    patch_bucket = int(np.prod(s["grid"]))
    packing = lambda rows, conts: PB.PackingConfig(
        rows=rows, max_continuations=conts, max_pairs=n_pairs, text_buckets=TEXT_BUCKETS, patch_buckets=(patch_bucket,)
    )
    packed = [PK.pack_round(cfg, g, p, packing(groups, 4))[0] for g, p in workload]
    unpacked = []
    for g, p in workload:
        ug, up = PK.unpack_groups(g, p)
        unpacked += PK.pack_unpacked(cfg, ug, up, packing(len(ug), 1))
    return packed, unpacked


def time_variants(cfg, params, config: ipl.TDPOConfig, workload, layouts, repeats: int, skip_trl: bool) -> list[dict]:
    """The packed, unpacked and TRL rows (TRL's a ``skipped`` row when it does not run). The variants take turns,
    one round each per repeat: a change in the machine's load (shared cores) then reaches all of them alike, and
    the medians compare like with like."""
    packed, unpacked = layouts
    variants = [JaxVariant("packed", params, config, packed), JaxVariant("unpacked", params, config, unpacked)]
    with tempfile.TemporaryDirectory() as tmp:
        trl = {"variant": "trl", "skipped": "--skip-trl"}
        if not skip_trl:
            trl = make_trl(cfg, params, workload, config, tmp)
        if not isinstance(trl, dict):
            variants.append(trl)
        for r in range(repeats):
            for v in variants:
                v.round()
            print(f"round {r + 1}/{repeats} done", flush=True)
    results = [v.result() for v in variants[:2]]
    our_ref = results[0].pop("_first_ref")
    unpacked_ref = results[1].pop("_first_ref")
    results[1]["max_abs_ref_logp_diff_vs_packed"] = float(
        max(np.max(np.abs(unpacked_ref[0] - our_ref[0])), np.max(np.abs(unpacked_ref[1] - our_ref[1])))
    )
    results.append(trl if isinstance(trl, dict) else trl.result(our_ref))
    return results


def summarize(results: list[dict], **about) -> dict:
    """The pairs/s ratios between the variants (None where one did not run), ``about`` and the rows."""
    by = {r["variant"]: r for r in results}

    def ratio(a, b, key="pairs_per_s"):
        return by[a][key] / by[b][key] if key in by[b] else None

    return {
        "ratio_vs_unpacked": ratio("packed", "unpacked"),
        "ratio_vs_trl": ratio("packed", "trl"),
        "ratio_vs_unpacked_step_only": ratio("packed", "unpacked", "pairs_per_s_step_only"),
        "unpacked_vs_trl": ratio("unpacked", "trl"),
        "ratio_vs_trl_step_only": ratio("packed", "trl", "pairs_per_s_step_only"),
        "unpacked_vs_trl_step_only": ratio("unpacked", "trl", "pairs_per_s_step_only"),
        **about,
        "results": results,
    }


def print_summary(summary: dict) -> None:
    print(
        f"\n{'variant':10s} {'rows':>5s} {'T':>5s} {'tok/pair':>9s} {'pad tok/pair':>12s} {'step s':>8s} "
        f"{'ref s':>7s} {'pairs/s':>9s}"
    )
    for r in summary["results"]:
        if "skipped" in r:
            print(f"{r['variant']:10s} skipped: {r['skipped']}")
            continue
        print(
            f"{r['variant']:10s} {r['rows']:5d} {r['T']:5d} {r['tokens_per_pair']:9.1f} "
            f"{r['padded_tokens_per_pair']:12.1f} {r['step_s']:8.2f} {r['reference_s']:7.2f} {r['pairs_per_s']:9.3f}"
        )
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}x"
    print(
        f"packed vs unpacked: {fmt(summary['ratio_vs_unpacked'])} pairs/s (step only "
        f"{fmt(summary['ratio_vs_unpacked_step_only'])}); vs TRL: packed {fmt(summary['ratio_vs_trl'])} (step only "
        f"{fmt(summary['ratio_vs_trl_step_only'])}), unpacked {fmt(summary['unpacked_vs_trl'])} (step only "
        f"{fmt(summary['unpacked_vs_trl_step_only'])})"
    )


def agreement(cfg, params, workload, ref_noise: float, json_out: str | None) -> int:
    """``--agreement`` on the workload's first batch: printed, written to ``json_out``; 0 when the targets are met."""
    groups, pairs = workload[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = run_agreement(
            cfg, params, groups, pairs, beta=0.1, ref_noise=ref_noise, key=jax.random.PRNGKey(1), tmp=tmp
        )
    print_agreement(out)
    if json_out:
        harness.write_json(json_out, {"trl_agreement": out}, indent=2)
    return 0 if out["pass"] else 1


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a small model (smoke test of the script)")
    size.add_argument("--tiny", action="store_true", help="the smallest model and pairs (the test suite's run)")
    parser.add_argument("--groups", type=int, default=2, help="prefix groups per batch (β, γ alternating)")
    parser.add_argument("--batches", type=int, default=1, help="distinct batches (same shapes)")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per batch")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--agreement", action="store_true", help="check agreement with TRL instead of timing")
    parser.add_argument("--ref-noise", type=float, default=0.02, help="--agreement: reference = policy + N(0, S^2)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.agreement:
        jax.config.update("jax_default_matmul_precision", "highest")
    s = SHAPES["tiny" if args.tiny else "quick" if args.quick else "default"]
    cfg = bench_model(s["size"])
    params = M.init_params(cfg, jax.random.PRNGKey(0), std=0.02)
    workload = make_workload(cfg, s, args.groups, args.batches, np.random.default_rng(0))
    n_pairs = len(workload[0][1])
    n_img = int(np.prod(s["grid"])) // cfg.vision.merge_factor
    print(
        f"model: {count_params(params) / 1e6:.1f}M parameters, {n_img} image tokens per step; "
        f"{args.groups} prefix groups and {n_pairs} pairs per step; jax {jax.__version__} on "
        f"{jax.devices()[0].platform}"
    )
    if args.agreement:
        return agreement(cfg, params, workload, args.ref_noise, args.json)

    config = ipl.TDPOConfig(model=cfg, logp_chunk=64)  # the paper's round-1 optimizer
    layouts = pack_layouts(cfg, s, workload, args.groups)
    results = time_variants(cfg, params, config, workload, layouts, args.repeats, args.skip_trl)
    for r in results:
        print(json.dumps(r))
    summary = summarize(results, params=count_params(params), image_tokens_per_step=n_img, pairs_per_step=n_pairs)
    print_summary(summary)
    if args.json:
        harness.write_json(args.json, summary, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
