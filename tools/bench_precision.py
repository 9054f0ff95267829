"""Benchmark: bf16 vs fp32 compute, with and without remat, for the T-DPO step and the CoaT-tree sampler.

One run, one process, the same random weights and the same batches for every variant (fp32 without remat is
the baseline of the ratios):

  T-DPO step (``preference.tdpo.tdpo_update`` on ``packing.pack_round`` batches from ``bench_tdpo``'s
  workload): fp32 / bf16 compute (fp32 master weights and Adam moments either way) x remat off / on. Reported:
  median step seconds, the compiled program's per-device memory (``memory_analysis``: arguments, temporaries,
  total) and matmul FLOPs (``planning.hlo_cost``), loss of the first step (bf16 should stay close to fp32).
  Sampler (``sampling.sample_tree`` on ``bench_tree``'s random steps): weights and KV cache in fp32 / bf16;
  median seconds of a warm call, compiled memory of the whole jitted tree program.

``--profile`` instead times the pieces of the T-DPO step on the same workload, packed vs unpacked layout (fp32,
as ``bench_tdpo`` runs it): the [B, T, T] mask, the vision tower, the decoder forward and forward+backward, the
log-prob head and the whole step, each jitted alone, with its matmul FLOPs and achieved GFLOP/s.

    python -m tools.bench_precision [--repeats R] [--json OUT] [--tiny] [--profile [--shape default|quick|tiny]]
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import model as M
from ipl_jax.model.params import count_params
from ipl_jax.model.text import forward_hidden, token_log_probs
from ipl_jax.planning.hlo_cost import hlo_flops
from ipl_jax.preference import packing as PK
from ipl_jax.preference import tdpo as ipl
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.prompts import pack_tree_prompts
from ipl_jax.sampling.tree_sampler import sample_tree_jit
from ipl_jax.training.state import cast_floating
from tools import harness
from tools.bench_models import bench_model, bench_shape
from tools.bench_tdpo import SHAPES as TDPO_SHAPES
from tools.bench_tdpo import make_workload, pack_layouts
from tools.bench_tree import SHAPES as TREE_SHAPES
from tools.bench_tree import random_steps

# The T-DPO model: between bench_tdpo's "quick" and "default" (about 12M parameters, 144 image tokens per row).
TDPO_SHAPE = bench_shape("12m", prompts=(24, 16), turns=(24, 24), action=(6, 12))


def median_time(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls (the callers warm up first)."""
    return harness.median_time(fn, warmup=0, repeats=repeats)


def memory(compiled) -> dict:
    """The compiled program's per-device memory as ``ipl-jax plan`` counts it, and its HLO GFLOPs."""
    m = harness.compiled_memory(compiled)
    return {
        "args_mb": m["arguments"] / 1e6,
        "temps_mb": m["temporaries"] / 1e6,
        "total_mb": m["total"] / 1e6,
        "gflop": hlo_flops(compiled.as_text()).flops / 1e9,
    }


def tdpo_batch(cfg, s, groups: int, layout: str):
    """One batch of bench_tdpo's workload (``groups`` prefix groups) in the ``layout`` "packed" or "unpacked"."""
    packed, unpacked = pack_layouts(cfg, s, make_workload(cfg, s, groups, 1, np.random.default_rng(0)), groups)
    return (packed if layout == "packed" else unpacked)[0]


def compiled_tdpo_step(params, batch, config):
    """(``batch`` with its reference log-probs, the T-DPO step compiled for it, ``{"state": a fresh state}``): the
    step's state lives in the box, which each timed call updates (the state is donated)."""
    ref_pos, ref_neg = ipl.reference_logps(params, batch, config)
    batch = batch.with_reference(np.asarray(ref_pos), np.asarray(ref_neg))
    state = ipl.init_state(jax.tree.map(lambda x: x.copy(), params), config, jax.random.PRNGKey(0))
    return batch, ipl.lower_tdpo_step(state, batch, config).compile(), {"state": state}


def run_tdpo(cfg, params, batch, dtype: str, remat: bool, repeats: int) -> dict:
    config = ipl.TDPOConfig(
        model=cfg.replace(dtype=dtype), remat=remat, logp_chunk=64, compute_dtype=None if dtype == "float32" else dtype
    )
    batch, compiled, box = compiled_tdpo_step(params, batch, config)

    def one():
        box["state"], metrics = compiled(box["state"], batch)
        box.setdefault("loss", float(metrics["loss"]))
        return metrics

    jax.block_until_ready(one())  # warm-up
    return {
        "program": "tdpo_step",
        "dtype": dtype,
        "remat": remat,
        "seconds": median_time(one, repeats),
        "loss": box["loss"],
        **memory(compiled),
    }


def run_sampler(cfg, params, steps, config, dtype: str, repeats: int) -> dict:
    scfg = cfg.replace(dtype=dtype, param_dtype=dtype)
    sparams = cast_floating(params, dtype)
    prompts = pack_tree_prompts(scfg, steps, config, 0)
    temperature = jnp.asarray(config.temperature, jnp.float32)
    compiled = sample_tree_jit.lower(sparams, scfg, prompts, temperature, config.compile_key(), None).compile()
    call = lambda: compiled(sparams, prompts, temperature)
    jax.block_until_ready(call())
    return {
        "program": "sampler",
        "dtype": dtype,
        "remat": False,
        "seconds": median_time(call, repeats),
        **memory(compiled),
    }


def precision_table(repeats: int, tdpo_shape: dict = TDPO_SHAPE, tree_shape: str = "quick") -> list[dict]:
    """The rows of every variant: the T-DPO step on ``tdpo_shape`` (bench_tdpo's workload), the sampler on
    bench_tree's ``tree_shape``."""
    cfg = bench_model(tdpo_shape["size"])
    params = M.init_params(cfg, jax.random.PRNGKey(0), std=0.02)
    batch = tdpo_batch(cfg, tdpo_shape, 2, "packed")
    print(
        f"T-DPO model {count_params(params) / 1e6:.1f}M params; batch {batch.rows} rows x {batch.length} tokens, "
        f"{batch.num_pairs} pairs; jax {jax.__version__} on {jax.devices()[0].platform}",
        flush=True,
    )
    rows = []
    for dtype in ("float32", "bfloat16"):
        for remat in (False, True):
            rows.append(run_tdpo(cfg, params, batch, dtype, remat, repeats))
            print(json.dumps(rows[-1]), flush=True)
    s = TREE_SHAPES[tree_shape]
    tcfg = bench_model(s["size"])
    tparams = M.init_params(tcfg, jax.random.PRNGKey(1), std=0.02)
    steps = random_steps(tcfg, s, 1, np.random.default_rng(0))
    v = tcfg.text.vocab_size
    config = SamplerConfig(
        branching=s["branching"],
        max_turn_tokens=s["turns"],
        eos_ids=(v,),
        suppress_ids=(tcfg.image_token_id, tcfg.video_token_id),
        prefix_buckets=(len(steps[0].prefix_ids),),
        prompt_buckets=tuple(sorted(set(s["prompts"]))),
        patch_buckets=(steps[0].pixel_values.shape[0],),
    )
    print(
        f"sampler model {count_params(tparams) / 1e6:.1f}M params, branching {s['branching']}, turns {s['turns']}",
        flush=True,
    )
    for dtype in ("float32", "bfloat16"):
        rows.append(run_sampler(tcfg, tparams, steps, config, dtype, repeats))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def print_precision(rows: list[dict]) -> None:
    base = {r["program"]: r for r in rows if r["dtype"] == "float32" and not r["remat"]}
    print(
        f"\n{'program':10s} {'dtype':9s} {'remat':5s} {'step s':>8s} {'x time':>7s} {'temps MB':>9s} "
        f"{'x temps':>8s} {'total MB':>9s} {'x total':>8s} {'GFLOP':>8s} {'loss':>9s}"
    )
    for r in rows:
        b = base[r["program"]]
        loss = f"{r['loss']:9.5f}" if "loss" in r else f"{'':9s}"
        print(
            f"{r['program']:10s} {r['dtype']:9s} {str(r['remat']):5s} {r['seconds']:8.3f} "
            f"{r['seconds'] / b['seconds']:7.2f} {r['temps_mb']:9.1f} {r['temps_mb'] / b['temps_mb']:8.2f} "
            f"{r['total_mb']:9.1f} {r['total_mb'] / b['total_mb']:8.2f} {r['gflop']:8.2f} {loss}"
        )


# ------------------------------------------------------------------------------------------------ profile


def profile(shape: str, repeats: int) -> list[dict]:
    """Seconds, matmul GFLOP and GFLOP/s of the T-DPO step's pieces, packed vs unpacked (fp32, no remat)."""
    s = TDPO_SHAPES[shape]
    cfg = bench_model(s["size"])
    params = M.init_params(cfg, jax.random.PRNGKey(0), std=0.02)
    config = ipl.TDPOConfig(model=cfg, logp_chunk=64)  # the paper's round-1 optimizer
    out = []
    for layout in ("packed", "unpacked"):
        batch = tdpo_batch(cfg, s, 2, layout)
        mask = PK.packed_attention_mask(batch.segment_ids)
        feats = PK.row_image_features(params, cfg, batch.vision)
        hidden = forward_hidden(params, cfg, batch.input_ids, batch.positions, mask, feats)
        valid = batch.segment_ids >= 0

        def decoder_loss(p, m):
            return jnp.sum(forward_hidden(p, cfg, batch.input_ids, batch.positions, m, feats).astype(jnp.float32))

        pieces = {
            "mask [B,T,T]": (jax.jit(PK.packed_attention_mask), (batch.segment_ids,)),
            "vision fwd": (jax.jit(PK.row_image_features, static_argnums=1), (params, cfg, batch.vision)),
            "decoder fwd": (
                jax.jit(lambda p, m: forward_hidden(p, cfg, batch.input_ids, batch.positions, m, feats)),
                (params, mask),
            ),
            "decoder fwd, 2-D mask": (
                jax.jit(lambda p, m: forward_hidden(p, cfg, batch.input_ids, batch.positions, m, feats)),
                (params, valid),
            ),
            "decoder fwd+bwd": (jax.jit(jax.grad(decoder_loss)), (params, mask)),
            "logp head fwd": (
                jax.jit(lambda p, h: token_log_probs(p, cfg, h, batch.target_ids, PK.chunk_for(batch.length, 64))),
                (params, hidden),
            ),
        }
        batch, step, box = compiled_tdpo_step(params, batch, config)

        def run_step():
            box["state"], m = step(box["state"], batch)
            return m

        jax.block_until_ready(run_step())
        for name, (fn, args) in pieces.items():
            compiled = fn.lower(*args).compile()
            jax.block_until_ready(compiled(*[a for a in args if not isinstance(a, type(cfg))]))
            sec = median_time(lambda: compiled(*[a for a in args if not isinstance(a, type(cfg))]), repeats)
            out.append(_piece(layout, batch, name, sec, compiled))
        out.append(_piece(layout, batch, "whole step", median_time(run_step, repeats), step))
        for r in out[-len(pieces) - 1 :]:
            print(json.dumps(r), flush=True)
    return out


def _piece(layout, batch, name, seconds, compiled) -> dict:
    gflop = hlo_flops(compiled.as_text()).flops / 1e9
    return {
        "layout": layout,
        "rows": batch.rows,
        "T": batch.length,
        "pairs": batch.num_pairs,
        "piece": name,
        "seconds": seconds,
        "gflop": gflop,
        "gflop_per_s": gflop / seconds,
    }


def print_profile(rows: list[dict]) -> None:
    by = {(r["layout"], r["piece"]): r for r in rows}
    print(
        f"\n{'piece':24s} {'packed s':>9s} {'GFLOP':>7s} {'GFLOP/s':>8s} {'unpacked s':>11s} {'GFLOP':>7s} "
        f"{'GFLOP/s':>8s} {'x time':>7s}"
    )
    for name in dict.fromkeys(r["piece"] for r in rows):
        p, u = by[("packed", name)], by[("unpacked", name)]
        print(
            f"{name:24s} {p['seconds']:9.3f} {p['gflop']:7.2f} {p['gflop_per_s']:8.1f} {u['seconds']:11.3f} "
            f"{u['gflop']:7.2f} {u['gflop_per_s']:8.1f} {u['seconds'] / p['seconds']:7.2f}"
        )
    p, u = by[("packed", "whole step")], by[("unpacked", "whole step")]
    print(
        f"packed: {p['rows']} rows x {p['T']} tokens; unpacked: {u['rows']} rows x {u['T']} tokens; "
        f"{p['pairs']} pairs each"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per variant (median)")
    ap.add_argument("--profile", action="store_true", help="time the T-DPO step's pieces, packed vs unpacked")
    ap.add_argument("--shape", choices=tuple(TDPO_SHAPES), default="default", help="--profile's model (bench_tdpo)")
    ap.add_argument("--tiny", action="store_true", help="the smallest models (the test suite's run; --shape tiny)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    if args.profile:
        rows = profile("tiny" if args.tiny else args.shape, args.repeats)
        print_profile(rows)
    elif args.tiny:
        rows = precision_table(args.repeats, TDPO_SHAPES["tiny"], "tiny")
        print_precision(rows)
    else:
        rows = precision_table(args.repeats)
        print_precision(rows)
    if args.json:
        harness.write_json(args.json, rows, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
