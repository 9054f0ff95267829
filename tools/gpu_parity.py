"""Check: every forward that trains or samples gives the reference attention's numbers under a fused kernel.

One random model in the compute dtype (``--size small``: the Qwen2-VL-2B architecture cut to 4 decoder layers and
4 vision blocks, real head dims 128 / 80; ``tiny`` for a CPU), run twice on the same inputs, ``--impl`` (default
'cudnn' on a GPU, 'xla' elsewhere: it receives the same arguments) against 'reference':

  vision      the tower on screenshots one per slot (per-slot lengths) and packed in one row (segment mask)
  decoder     logits of left- and right-padded rows (key-padding spec, the causal hint)
  packed      T-DPO rows: summed continuation log-probs of prefix-packed rows, and their gradient
  sampler     prefill logits with a screenshot, then three cached decode steps (greedy tokens and logits)

Prints and writes (``--json``) max |Δ| per check (logits, features, log-probs; gradients as the largest
difference relative to the leaf's largest entry) and ``ok`` against ``--tolerance`` (2e-2 on logits in bf16).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import model as M
from ipl_jax.model import decode
from ipl_jax.model.inputs import prepare_vision_slots
from ipl_jax.model.params import init_params
from ipl_jax.preference import packing as PK
from tools import harness
from tools.gpu_mfu import TINY, model_2b, random_batch


def small_model(size: str, dtype: str):
    if size == "tiny":
        cfg = TINY
    else:
        cfg = model_2b()
        cfg = cfg.replace(
            text=dataclasses.replace(cfg.text, num_hidden_layers=4),
            vision=dataclasses.replace(cfg.vision, depth=4),
        )
    return cfg.replace(dtype=dtype, param_dtype=dtype)


def _max(a) -> float:
    return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32))))


def _images(cfg, rng, grids):
    n = int(sum(np.prod(g) for g in grids))
    return rng.standard_normal((n, cfg.vision.patch_dim)).astype(np.float32), np.asarray(grids)


def check_vision(params, cfgs, rng) -> dict:
    ref_cfg, cfg = cfgs
    grids = [[1, 16, 12], [1, 12, 20]]
    pix, g = _images(ref_cfg, rng, grids)
    packed = M.prepare_vision(ref_cfg, pix, g, patch_buckets=(512,))
    slots = prepare_vision_slots(ref_cfg, pix, g, 256)
    real = int(np.prod(g, axis=1).sum()) // ref_cfg.vision.merge_factor
    out = {}
    for name, v in (("slots", slots), ("packed", packed)):
        a = M.encode_images(params, ref_cfg, v)[:real]
        b = M.encode_images(params, cfg, v)[:real]
        out[f"{name}_features_max_abs"] = _max(a - b)
        out[f"{name}_features_scale"] = _max(a)
    return out


def check_decoder(params, cfgs, rng) -> dict:
    ref_cfg, cfg = cfgs
    b, t = 3, 256
    ids = jnp.asarray(rng.integers(10, ref_cfg.image_token_id - 10, (b, t)), jnp.int32)
    valid = np.ones((b, t), bool)
    valid[0, :37] = False  # left padding
    valid[1, 200:] = False  # right padding
    pos = jnp.broadcast_to(jnp.cumsum(jnp.asarray(valid, jnp.int32), axis=1)[None], (3, b, t))
    a = M.forward(params, ref_cfg, ids, pos, jnp.asarray(valid))
    c = M.forward(params, cfg, ids, pos, jnp.asarray(valid))
    return {"logits_max_abs": _max(jnp.where(valid[..., None], a - c, 0)), "logits_scale": _max(a)}


def check_packed(params, cfgs, rng, rows=2, length=1024, patches=256) -> dict:
    ref_cfg, cfg = cfgs
    batch = jax.device_put(random_batch(ref_cfg, rows, length, patches, 4, 6, rng))

    def total(p, c):
        lp, n = PK.continuation_logps(p, c, batch)
        return jnp.sum(lp), lp

    out = {}
    grads, lps = [], []
    for c in (ref_cfg, cfg):
        (_, lp), g = jax.jit(jax.value_and_grad(lambda p, c=c: total(p, c), has_aux=True))(params)
        grads.append(g)
        lps.append(lp)
    out["logps_max_abs"] = _max(lps[0] - lps[1])
    out["logps_scale"] = _max(lps[0])
    rel = jax.tree.map(lambda a, b: _max(a - b) / max(_max(a), 1e-30), grads[0], grads[1])
    out["grad_max_rel"] = max(jax.tree.leaves(rel))
    flat = [jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(g)]) for g in grads]
    out["grad_cosine"] = float(jnp.dot(flat[0], flat[1]) / (jnp.linalg.norm(flat[0]) * jnp.linalg.norm(flat[1])))
    return out


def check_sampler(params, cfgs, rng) -> dict:
    ref_cfg, _ = cfgs
    grids = [[1, 16, 12]]
    pix, g = _images(ref_cfg, rng, grids)
    n_img = int(np.prod(g)) // ref_cfg.vision.merge_factor
    seqs = []
    for lead in (20, 57):
        text = rng.integers(10, ref_cfg.image_token_id - 10, lead + 30).tolist()
        seqs.append(
            text[:lead]
            + [ref_cfg.vision_start_token_id]
            + [ref_cfg.image_token_id] * n_img
            + [ref_cfg.vision_end_token_id]
            + text[lead:]
        )
    pix2 = np.concatenate([pix, pix])
    out, runs = {}, []
    for c in cfgs:
        inputs = M.prepare_inputs(
            c, seqs, pixel_values=pix2, image_grid_thw=np.concatenate([g, g]), text_buckets=(256,), patch_buckets=(512,)
        )
        logits, cache = decode.prefill(params, c, inputs, cache_size=320, all_logits=True)
        steps = []
        last = logits[jnp.arange(2), decode.last_valid_index(jnp.asarray(inputs.attention_mask))]
        for _ in range(3):
            tok = jnp.argmax(last, axis=-1).astype(jnp.int32)
            last, cache = decode.decode_step(params, c, cache, tok, jnp.ones((2,), bool))
            steps.append((tok, last))
        runs.append((np.asarray(inputs.attention_mask), logits, steps))
    valid = runs[0][0]
    out["prefill_logits_max_abs"] = _max(jnp.where(valid[..., None], runs[0][1] - runs[1][1], 0))
    out["prefill_logits_scale"] = _max(runs[0][1])
    out["decode_logits_max_abs"] = max(_max(a[1] - b[1]) for a, b in zip(runs[0][2], runs[1][2]))
    out["greedy_tokens_equal"] = all(bool(jnp.all(a[0] == b[0])) for a, b in zip(runs[0][2], runs[1][2]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("small", "tiny"), default="small")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--impl", default=None, help="the implementation checked (default: cudnn on a GPU, else xla)")
    ap.add_argument("--tolerance", type=float, default=2e-2, help="max |Δlogit| (and |Δ log-prob| per token)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    impl = args.impl or ("cudnn" if jax.default_backend() == "gpu" else "xla")
    base = small_model(args.size, args.dtype)
    cfgs = (base.replace(attention="reference"), base.replace(attention=impl))
    res = {"device": jax.devices()[0].device_kind, "impl": impl, "dtype": args.dtype, "size": args.size}
    params = jax.jit(init_params, static_argnums=0)(cfgs[0], jax.random.PRNGKey(0))
    params = jax.tree.map(lambda a: a.astype(args.dtype), params)
    checks = {"vision": check_vision, "decoder": check_decoder, "packed": check_packed, "sampler": check_sampler}
    for name, fn in checks.items():
        t0 = time.perf_counter()
        try:
            res[name] = fn(params, cfgs, np.random.default_rng(0))
        except Exception as e:  # a path that fails is the finding; the other checks still run
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        res[name]["seconds"] = time.perf_counter() - t0
        print(name, json.dumps(res[name]), flush=True)
        if args.json:
            harness.write_json(args.json, res)
    logit_diffs = [res["decoder"].get("logits_max_abs"), res["sampler"].get("prefill_logits_max_abs")]
    res["ok"] = all(d is not None and d <= args.tolerance for d in logit_diffs) and all(
        "error" not in res[k] for k in checks
    )
    if args.json:
        harness.write_json(args.json, res)
    print(f"{impl} vs reference: {'ok' if res['ok'] else 'FAILED'} (max |Δlogit| {logit_diffs})")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
