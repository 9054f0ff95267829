"""Measurement: model FLOPs utilisation (MFU) of the T-DPO step for a Qwen2-VL-2B-sized model on one accelerator.

Random parameters of the 2B architecture are drawn on the device (fp32 master weights and Adam moments, bf16
compute, decoder layers rematerialised, the ViT frozen as in the job's IPL rounds); one packed batch of random
tokens (``--rows`` rows of ``--length`` tokens: a prefix with one screenshot of ``--patches`` patches and K + 1
continuations, ``--pairs`` pairs) is fed to ``preference.tdpo.tdpo_update``, compiled ahead of time; after
``--warmup`` untimed steps, ``--steps`` steps are timed (each waits for its metrics).

FLOPs per step are counted two ways:
  model FLOPs  the matmuls the step needs (decoder + log-prob head forward and backward, the frozen ViT forward
               only, attention over every [T, T] / per-row [P, P] score as the dense kernels compute it), no
               recomputation: MFU = model FLOPs / step time / peak;
  HLO FLOPs    the matmuls in the compiled program (``planning.hlo_cost``, remat recomputation included):
               hardware FLOPs utilisation, HFU. XLA's own ``cost_analysis()`` counts a layer loop once and is
               printed only for reference.
Peak: ``--peak-tflops``, else the vendor's dense bf16 figure for the device kind (H100 / H200 SXM: 989.4
TFLOP/s; A100: 312), and a bf16 matmul measured in the same run for comparison.

Needs only jax, flax, optax, numpy and pillow besides ipl_jax's model / preference / training modules (no grain,
no tfrecord, no torch, no ml_collections). Results go to stdout and ``--json``.

    python -m tools.gpu_mfu [--size 2b|tiny] [--rows 8] [--length 4096] [--patches 4096] [--steps 10]
                            [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.layers import resolve_attention
from ipl_jax.model.params import count_params, init_params
from ipl_jax.model.sizes import Size, small_config
from ipl_jax.model.vision import VisionInputs
from ipl_jax.planning.hlo_cost import hlo_flops
from ipl_jax.preference import tdpo
from ipl_jax.preference.packed_batch import PackedBatch
from ipl_jax.training.state import VISION_REGEX
from tools import harness

PEAK_BF16_TFLOPS = {"h200": 989.4, "h100": 989.4, "a100": 312.0, "l4": 121.0}  # dense, SXM where it matters
TINY = small_config(Size(128, 2, 4, 2, 384, 1024, 64, 2, 4), tie=True)  # --size tiny (gpu_parity's too)


def model_2b() -> Qwen2VLConfig:
    from ipl_jax.planning.shapes import ARCHITECTURES

    return Qwen2VLConfig.from_hf_dict(ARCHITECTURES["qwen2-vl-2b"])


def random_batch(
    cfg: Qwen2VLConfig, rows: int, length: int, patches: int, slots: int, pairs: int, rng: np.random.Generator
) -> PackedBatch:
    """Rows laid out as the packer lays them: [text, image tokens, text | K+1 continuations | pad]; text
    positions on all three M-RoPE rows (the image's grid positions do not change the cost)."""
    merge = cfg.vision.merge_factor
    n_img = patches // merge
    cont = max(2, (length - n_img - 64) // (slots + 1))  # continuation length; ~1/(K+2) of the row left as pad
    ids = rng.integers(10, cfg.image_token_id - 10, (rows, length)).astype(np.int32)
    seg = np.full((rows, length), -1, np.int32)
    slot = np.full((rows, length), -1, np.int32)
    prefix = 32 + n_img + 32
    ids[:, 32 : 32 + n_img] = cfg.image_token_id
    seg[:, :prefix] = 0
    for k in range(slots):
        a, b = prefix + k * cont, prefix + (k + 1) * cont
        seg[:, a:b], slot[:, a:b] = k + 1, k
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (3, rows, length)).copy()
    width = max(2, int(np.sqrt(patches)))
    hw = np.stack([np.arange(patches) // width, np.arange(patches) % width], -1).astype(np.int32)
    vision = VisionInputs(
        patches=rng.standard_normal((rows, patches, cfg.vision.patch_dim)).astype(np.float32),
        pos_hw=np.broadcast_to(hw, (rows, patches, 2)).copy(),
        segment_ids=np.zeros((rows, patches), np.int32),
    )
    flat = np.arange(rows * slots).reshape(rows, slots)
    pos_i = np.resize(flat[:, 0], pairs).astype(np.int32)
    neg_i = np.resize(flat[:, 1:].reshape(-1), pairs).astype(np.int32)
    return PackedBatch(
        input_ids=ids,
        positions=pos,
        segment_ids=seg,
        target_ids=ids,
        score_slot=slot,
        vision=vision,
        pair_pos=pos_i,
        pair_neg=neg_i,
        pair_valid=np.ones(pairs, bool),
        pair_turn=np.ones(pairs, np.int32),
        ref_pos=np.zeros(pairs, np.float32),
        ref_neg=np.zeros(pairs, np.float32),
        max_continuations=slots,
    )


def model_flops(cfg: Qwen2VLConfig, rows: int, length: int, patches: int) -> dict:
    """Matmul FLOPs of one T-DPO step without recomputation: decoder + head x3 (forward, two backward
    products), the frozen ViT x1. Attention counts every score of the dense [T, T] and per-row [P, P] kernels."""
    t, v = cfg.text, cfg.vision
    tokens = rows * length
    d_q, d_kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    dense = t.hidden_size * (2 * d_q + 2 * d_kv) + 3 * t.hidden_size * t.intermediate_size
    decoder = t.num_hidden_layers * (2 * tokens * dense + 4 * rows * length * length * d_q)
    head = 2 * tokens * t.hidden_size * t.vocab_size
    e = v.embed_dim
    n_patch = rows * patches
    block = 2 * n_patch * (3 * e * e + e * e + 2 * e * v.mlp_dim) + 4 * rows * patches * patches * e
    merged = n_patch // v.merge_factor
    vision = (
        2 * n_patch * v.patch_dim * e
        + v.depth * block
        + 2 * merged * ((v.merge_factor * e) ** 2 + v.merge_factor * e * v.hidden_size)
    )
    return {"decoder": 3 * decoder, "head": 3 * head, "vision": vision, "total": 3 * (decoder + head) + vision}


def spec_peak(device) -> float | None:
    kind = device.device_kind.lower()
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in kind:
            return tflops * 1e12
    return None


def run(args) -> dict:
    dev = jax.devices()[0]
    res = {
        "device": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "size": args.size,
        "rows": args.rows,
        "length": args.length,
        "patches": args.patches,
        "slots": args.slots,
        "pairs": args.pairs,
        "remat": "none" if args.no_remat else args.remat,
        "attention": args.attention,
        "dtype": args.dtype,
    }
    cfg = (model_2b() if args.size == "2b" else TINY).replace(dtype=args.dtype, attention=args.attention)
    config = tdpo.TDPOConfig(
        model=cfg,
        remat="none" if args.no_remat else args.remat,
        compute_dtype=None if args.dtype == "float32" else args.dtype,
    )
    t0 = time.perf_counter()
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    state = tdpo.init_state(params, config, jax.random.PRNGKey(1), freeze_regex=VISION_REGEX)
    del params
    batch = random_batch(cfg, args.rows, args.length, args.patches, args.slots, args.pairs, np.random.default_rng(0))
    batch = jax.device_put(batch)
    res["params"] = count_params(state.params) + count_params(state.frozen)
    res["init_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = tdpo.lower_tdpo_step(state, batch, config).compile()
    res["compile_s"] = time.perf_counter() - t0
    mem = harness.compiled_memory(compiled)
    if mem is not None:
        names = {"argument": "arguments", "output": "outputs", "temp": "temporaries", "alias": "aliased"}
        res["memory_gb"] = {k: mem[v] / 1e9 for k, v in names.items()}
    cost = hlo_flops(compiled.as_text())
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, (list, tuple)) else (xla or {})
    res["hlo_flops"], res["hlo_uncounted"], res["xla_cost_flops"] = cost.flops, list(cost.uncounted), xla.get("flops")
    res["model_flops"] = model_flops(cfg, args.rows, args.length, args.patches)
    print(json.dumps({k: res[k] for k in ("device", "params", "compile_s", "hlo_flops")}), flush=True)
    box = {"state": state}

    def step():
        box["state"], box["metrics"] = compiled(box["state"], batch)
        return jax.block_until_ready(box["metrics"])

    times = harness.timings(step, warmup=args.warmup, repeats=args.steps)
    sec = statistics.median(times)
    res.update(step_s_median=sec, step_s_all=times, loss=float(box["metrics"]["loss"]))
    res["attention_resolved"] = resolve_attention(cfg.attention, cfg.dtype, (cfg.text.head_dim, cfg.vision.head_dim))
    peak_bytes = harness.device_peak_bytes(dev)
    res["peak_memory_gb"] = None if peak_bytes is None else peak_bytes / 1e9
    peak = args.peak_tflops * 1e12 if args.peak_tflops else spec_peak(dev)
    measured = harness.matmul_peak(jnp.dtype(args.dtype), n=8192) if not args.skip_matmul else None
    res.update(
        peak_flops=peak,
        peak_source="--peak-tflops" if args.peak_tflops else "device kind",
        matmul_flops_measured=measured,
    )
    mf, hf = res["model_flops"]["total"], cost.flops
    if args.profile:
        from tools.xla_profile import profile_parts

        res["profile"] = profile_parts(compiled.as_text(), step, calls=2, trace_dir=args.profile)
    res["achieved_model_tflops"] = mf / sec / 1e12
    res["achieved_hlo_tflops"] = hf / sec / 1e12
    if peak:
        res["mfu"], res["hfu"] = mf / sec / peak, hf / sec / peak
    if measured:
        res["mfu_vs_measured_matmul"] = mf / sec / measured
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("2b", "tiny"), default="2b")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--patches", type=int, default=4096, help="patches of one row's screenshot (multiple of 4)")
    ap.add_argument("--slots", type=int, default=4, help="continuations per row (K + 1)")
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-remat", action="store_true")
    ap.add_argument("--remat", default="full", help="policy (model.layers.REMAT_POLICIES; --no-remat: none)")
    ap.add_argument("--attention", default="auto", help="auto, reference, xla or cudnn (model.layers)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the chip's peak (default: by device kind)")
    ap.add_argument("--skip-matmul", action="store_true", help="do not measure the bf16 matmul peak")
    ap.add_argument("--profile", default=None, help="trace 2 steps into this folder; per-part times in the JSON")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.patches % 4:
        ap.error("--patches must be a multiple of 4 (the 2x2 merge)")
    if args.profile:  # one event per kernel: XLA's command buffers would group a layer's kernels into one
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()
    try:
        res = run(args)
        status = 0
    except Exception as e:
        res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        status = 1
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        harness.write_json(args.json, res, indent=2)
    if status == 0 and "mfu" in res:
        print(
            f"MFU {100 * res['mfu']:.1f}% (model {res['achieved_model_tflops']:.1f} TFLOP/s of "
            f"{res['peak_flops'] / 1e12:.0f}); HFU {100 * res['hfu']:.1f}%; step {res['step_s_median']:.3f} s"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
