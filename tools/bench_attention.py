"""Benchmark: the attention implementations side by side on the shapes the 2B T-DPO step runs.

Two problems, each run by every implementation in one process on the same random bf16 inputs:

  decoder  B rows of T tokens, Qwen2-VL-2B's heads (12 query, 2 KV, head dim 128), the prefix-packed mask of a
           T-DPO row (a prefix of 1124 tokens seen by every continuation, K + 1 continuations each causal over
           itself, padding);
  vision   N screenshots of P patches, one per slot, the 2B ViT's heads (16, head dim 80), real patches first
           and padding after (block-diagonal: padding sees only padding).

For each: forward time, forward + backward time (median of ``--reps`` after a warm call), and the largest
difference from ``reference`` on the real tokens (outputs and the three input gradients; padding rows get a zero
cotangent, as in training). Ratios are against ``reference``.

    python -m tools.bench_attention [--problem decoder|vision|both] [--impls reference,xla,cudnn] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.model import layers
from ipl_jax.model.text import spec_masks
from tools.harness import median_time, write_json


def decoder_problem(rows: int, length: int, continuations: int = 4):
    prefix = 1124
    cont = (length - prefix) * 3 // (4 * continuations)
    seg = np.full((rows, length), -1, np.int32)
    seg[:, :prefix] = 0
    for k in range(continuations):
        seg[:, prefix + k * cont : prefix + (k + 1) * cont] = k + 1
    mask_of, per_query, per_key = spec_masks(jnp.asarray(seg))
    shapes = dict(b=rows, t=length, hq=12, hkv=2, d=128)
    return dict(seg=seg, mask_of=mask_of, per_query=per_query, per_key=per_key, causal=True, **shapes)


def vision_problem(images: int, patches: int):
    real = patches - patches // 8
    seg = np.full((images, patches), -1, np.int32)
    seg[:, :real] = 0
    shapes = dict(b=images, t=patches, hq=16, hkv=16, d=80)
    return dict(
        seg=seg,
        mask_of=layers.same_segment,
        per_query=jnp.asarray(seg),
        per_key=jnp.asarray(seg),
        causal=False,
        lengths=np.full((images,), real, np.int32),
        **shapes,
    )


def attend(impl: str, problem: dict):
    """fn(q, k, v) -> out for one implementation name (see ``--impls``)."""
    mask_of, pq, pk = problem["mask_of"], problem["per_query"], problem["per_key"]
    if impl in layers.ATTENTION_IMPLS:
        chunk = 2048
        return lambda q, k, v: layers.masked_attention(q, k, v, mask_of, pq, pk, chunk, impl)
    full = mask_of(pq, pk)[:, None]  # bool[B, 1, T, S]
    if impl == "cudnn_bias":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=full, implementation="cudnn")
    if impl == "cudnn_bias_causal":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=full, is_causal=True, implementation="cudnn")
    if impl == "cudnn_causal_only":  # upper bound for the decoder: causal without the segment structure
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    if impl == "cudnn_lengths":
        n = jnp.asarray(problem["lengths"])
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, query_seq_lengths=n, key_value_seq_lengths=n, implementation="cudnn"
        )
    if impl == "cudnn_nomask":  # upper bound for the tower: no mask at all
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
    raise ValueError(f"unknown implementation {impl!r}")


def run_problem(name: str, problem: dict, impls: list[str], reps: int, dtype) -> dict:
    b, t, hq, hkv, d = (problem[k] for k in ("b", "t", "hq", "hkv", "d"))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (b, t, hq, d), dtype)
    k = jax.random.normal(keys[1], (b, t, hkv, d), dtype)
    v = jax.random.normal(keys[2], (b, t, hkv, d), dtype)
    real = jnp.asarray(problem["seg"] >= 0)[:, :, None, None]
    # padding rows feed nothing downstream (their cotangent is 0, as in training), so their outputs may differ
    cot = jnp.where(real, jax.random.normal(keys[3], (b, t, hq, d), dtype), 0).astype(dtype)
    out = {"shape": dict(b=b, t=t, hq=hq, hkv=hkv, d=d), "impls": {}}
    base = None
    for impl in impls:
        res = {}
        try:
            fn = attend(impl, problem)
            fwd = jax.jit(fn)
            grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum((fn(q, k, v) * cot).astype(jnp.float32)), (0, 1, 2)))
            res["forward_ms"] = 1e3 * median_time(fwd, q, k, v, repeats=reps)
            res["forward_backward_ms"] = 1e3 * median_time(lambda *a: (fwd(*a), grad(*a)), q, k, v, repeats=reps)
            o, g = fwd(q, k, v), grad(q, k, v)
            if base is None:
                base = (o, g)
            else:
                res["max_abs_diff_out"] = float(jnp.max(jnp.where(real, jnp.abs(o - base[0]), 0)))
                res["max_abs_diff_grad"] = [
                    float(jnp.max(jnp.where(real, jnp.abs(a - c), 0))) for a, c in zip(g[1:], base[1][1:])
                ]
                res["max_abs_diff_dq"] = float(jnp.max(jnp.where(real, jnp.abs(g[0] - base[1][0]), 0)))
        except Exception as e:  # an implementation that does not run here is reported, not fatal
            res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        out["impls"][impl] = res
        print(name, impl, json.dumps(res), flush=True)
    ref = out["impls"].get(impls[0], {})
    for res in out["impls"].values():
        for key in ("forward_ms", "forward_backward_ms"):
            if key in res and key in ref:
                res[key.replace("_ms", "_speedup")] = ref[key] / res[key]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", choices=("decoder", "vision", "both"), default="both")
    ap.add_argument("--impls", default=None, help="comma-separated; the first is the baseline")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dtype = jnp.dtype(args.dtype)
    gpu = jax.default_backend() == "gpu"
    results = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    if args.problem in ("decoder", "both"):
        fused = ["cudnn_bias", "cudnn_bias_causal", "cudnn_causal_only"] if gpu else []
        impls = args.impls.split(",") if args.impls else ["reference", "xla"] + fused
        results["decoder"] = run_problem("decoder", decoder_problem(args.rows, args.length), impls, args.reps, dtype)
    if args.problem in ("vision", "both"):
        fused = ["cudnn_lengths", "cudnn_bias", "cudnn_nomask"] if gpu else []
        impls = args.impls.split(",") if args.impls else ["reference", "xla"] + fused
        results["vision"] = run_problem("vision", vision_problem(args.rows, args.length), impls, args.reps, dtype)
    if args.json:
        write_json(args.json, results)
    for prob in ("decoder", "vision"):
        for impl, res in results.get(prob, {}).get("impls", {}).items():
            if "forward_ms" in res:
                print(
                    f"{prob:8s} {impl:20s} fwd {res['forward_ms']:8.2f} ms ({res.get('forward_speedup', 1):.2f}x)  "
                    f"fwd+bwd {res['forward_backward_ms']:8.2f} ms ({res.get('forward_backward_speedup', 1):.2f}x)"
                )
            else:
                print(f"{prob:8s} {impl:20s} {res.get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
