"""Benchmark: CoaT-tree sampling throughput (leaves/s), prefix sharing vs no sharing vs transformers.

One run, one process, same random weights (fp32) and the same tree shape for all three:

  (a) ours: ``ipl_jax.sampling.sample_tree`` — prefill once per step, fan the KV cache out at each level;
  (b) no-sharing: ``sample_tree_no_sharing`` — every node re-prefills its whole context (image re-encoded);
  (c) transformers: ``Qwen2VLForConditionalGeneration.generate`` on the same weights (exported with
      ``save_params``), building the tree level by level with ``num_return_sequences = b_t`` (sampling for
      turns 1-3, greedy for turn 4), each level's contexts = the previous level's outputs + the next prompt.

No stop token is active (the end-of-turn id is set outside the vocabulary / to None), so every turn runs its
full budget and all three produce trees with exactly the same number of tokens. Our sampler is timed on a
second, warm call; no-sharing runs once and its compilation time (JAX's compile event spans) is subtracted;
transformers runs once after a one-token warm-up. "Useful FLOPs" count the work the tree needs with prefix
sharing (vision once per step, each prefix / prompt token once, one logits row per sampled token, causal
attention over the real context); achieved FLOP/s is that over each method's time, compared with the best of a
few large ``jnp`` matmuls measured in the same run.

    python -m tools.bench_tree [--quick | --full | --tiny] [--steps B] [--json OUT] [--skip-transformers]
                               [--skip-no-sharing]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import model as M
from ipl_jax.coat.tree import NUM_TURNS, num_leaves, num_nodes
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import count_params
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.no_sharing import sample_tree_no_sharing
from ipl_jax.sampling.prompts import StepPrompts, pack_tree_prompts
from ipl_jax.sampling.tree_sampler import sample_tree
from tools import harness
from tools.bench_models import bench_model, bench_shape

# name -> model sizes and tree shape. "default" and "full": 53M parameters, 529 image tokens per step, turns
# 48/48/16/16; "default" samples K=2 trees (8 leaves) so that the two baselines, which re-encode every
# prefix, finish in a few minutes on 2 CPU cores; "full" is the paper's K=3 (27 leaves, ~3x longer).
_BENCH_MODEL = bench_shape("53m", prompts=(40, 28, 16), turns=(48, 48, 16, 16), steps=1)
SHAPES = {
    "default": dict(_BENCH_MODEL, branching=(2, 2, 2, 1)),
    "full": dict(_BENCH_MODEL, branching=(3, 3, 3, 1)),
    "quick": bench_shape("12m", prompts=(24, 16, 12), turns=(16, 16, 8, 8), branching=(2, 2, 2, 1), steps=1),
    # the test suite's run: the smallest model, 4 leaves of a few tokens
    "tiny": bench_shape("tiny", prompts=(3, 3, 3), turns=(3, 3, 2, 2), branching=(2, 2, 1, 1), steps=1),
}


def random_steps(cfg: Qwen2VLConfig, s: dict, n: int, rng: np.random.Generator) -> list[StepPrompts]:
    """n steps of identical shapes (so transformers needs no padding): random image and text tokens."""
    t, h, w = s["grid"]
    text = lambda k: rng.integers(10, cfg.image_token_id - 10, k).tolist()
    out = []
    for i in range(n):
        prefix = harness.random_prefix(cfg, s, rng)
        out.append(
            StepPrompts(
                prefix_ids=np.asarray(prefix, np.int32),
                turn_prompt_ids=tuple(np.asarray(text(q), np.int32) for q in s["prompts"]),
                pixel_values=rng.standard_normal((t * h * w, cfg.vision.patch_dim)).astype(np.float32),
                image_grid_thw=np.asarray([[t, h, w]], np.int64),
                uid=1000 + i,
            )
        )
    return out


# ------------------------------------------------------------------------------------------------ timing


class CompileSpans:
    """Collects JAX's compile-related event spans (tracing, lowering, backend compile); ``total(t0, t1)`` is
    the length of their union inside [t0, t1] (nested spans are counted once)."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.spans: list[tuple[float, float]] = []
        jax.monitoring.register_event_time_span_listener(self._on_span)

    def _on_span(self, event, start, end, **kw):
        if event in self.EVENTS:
            self.spans.append((start, end))

    def total(self, t0: float, t1: float) -> float:
        spans = sorted((max(a, t0), min(b, t1)) for a, b in self.spans if b > t0 and a < t1)
        total, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    total += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            total += cur_b - cur_a
        return total


# ------------------------------------------------------------------------------------------------ FLOPs


def _vision_flops(cfg: Qwen2VLConfig, patches: int) -> float:
    v = cfg.vision
    e, m = v.embed_dim, v.merge_factor
    per_patch = v.patch_dim * e + v.depth * (3 * e * e + e * e + 2 * e * v.mlp_dim)
    merger = (patches // m) * ((m * e) ** 2 + m * e * v.hidden_size)
    attention = v.depth * 4 * patches * patches * e  # QK^T and PV, full attention within one image
    return 2.0 * (patches * per_patch + merger) + attention


def _text_flops(cfg: Qwen2VLConfig, n_tokens: float, ctx_sum: float, logits: float) -> float:
    """n tokens whose attention contexts sum to ctx_sum, ``logits`` of them with an lm_head row."""
    t = cfg.text
    q = t.num_attention_heads * t.head_dim
    kv = t.num_key_value_heads * t.head_dim
    per_token = t.num_hidden_layers * (t.hidden_size * (2 * q + 2 * kv) + 3 * t.hidden_size * t.intermediate_size)
    return (
        2.0 * n_tokens * per_token
        + 4.0 * t.num_hidden_layers * q * ctx_sum
        + 2.0 * logits * t.hidden_size * t.vocab_size
    )


def _span(c0: float, n: float) -> float:
    """Sum of attention contexts of n tokens appended after c0 tokens: (c0+1) + ... + (c0+n)."""
    return n * c0 + n * (n + 1) / 2


def useful_tree_flops(cfg: Qwen2VLConfig, steps: list[StepPrompts], config: SamplerConfig) -> float:
    """FLOPs a full-budget tree needs with prefix sharing (module docstring), summed over the steps."""
    br, T = config.branching, config.max_turn_tokens
    total = 0.0
    for s in steps:
        total += _vision_flops(cfg, s.pixel_values.shape[0])
        ctx = len(s.prefix_ids)
        total += _text_flops(cfg, ctx, _span(0, ctx), 0)
        for t in range(1, NUM_TURNS + 1):
            parents, nodes = num_nodes(br, t - 1), num_nodes(br, t)
            if t > 1:
                q = len(s.turn_prompt_ids[t - 2])
                total += parents * _text_flops(cfg, q, _span(ctx, q), 0)
                ctx += q
            total += nodes * _text_flops(cfg, T[t - 1], _span(ctx, T[t - 1]), T[t - 1])
            ctx += T[t - 1]
    return total


# ------------------------------------------------------------------------------------------------ runs


def run_ours(params, cfg, steps, config, seed=0) -> tuple[float, float, object]:
    """(compile+first call seconds, warm call seconds, tree)."""
    tp = pack_tree_prompts(cfg, steps, config, seed)
    _, first = harness.timed(sample_tree, params, cfg, tp, config)
    tp = pack_tree_prompts(cfg, steps, config, seed + 1)
    tree, warm = harness.timed(sample_tree, params, cfg, tp, config)
    return first, warm, tree


def run_no_sharing(params, cfg, steps, config, clock: CompileSpans, seed=0) -> tuple[float, float]:
    """(wall seconds, seconds without compilation)."""
    t0 = time.time()
    jax.block_until_ready(sample_tree_no_sharing(params, cfg, steps, config, seed))
    t1 = time.time()
    return t1 - t0, (t1 - t0) - clock.total(t0, t1)


def run_transformers(model_dir: str, cfg: Qwen2VLConfig, steps, config) -> float:
    """Seconds for transformers to build the same tree, level by level, with ``generate`` (weights from
    ``model_dir``, float32 on the CPU)."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = Qwen2VLForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    return transformers_tree_seconds(model, cfg, steps, config)


def transformers_tree_seconds(model, cfg: Qwen2VLConfig, steps, config, device: str = "cpu") -> float:
    """Seconds for a transformers Qwen2-VL ``model`` (on ``device``) to build the trees of ``steps``, level by
    level with ``generate``: ``num_return_sequences = b_t`` (sampling for turns 1-3, greedy for turn 4), each
    level's contexts = the previous level's outputs + the next prompt, every image re-encoded with its rows
    (the pixels are put on the device once, before timing); the sampler's ``suppress_ids`` are never drawn. A
    one-token warm-up runs first; every turn must run its full budget."""
    import torch

    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = None, 0, None
    br, T = config.branching, config.max_turn_tokens
    pixels = {id(s): torch.tensor(s.pixel_values, device=device) for s in steps}  # on the device before timing

    def generate(seqs, images, k, budget, sample):
        ids = torch.tensor(np.stack(seqs).astype(np.int64), device=device)
        pv = torch.cat([pixels[id(s)] for s in images])
        grid = torch.tensor(np.concatenate([s.image_grid_thw for s in images]), device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=pv,
                image_grid_thw=grid,
                mm_token_type_ids=(ids == cfg.image_token_id).long(),
                do_sample=sample,
                temperature=1.0 if sample else None,
                top_k=0 if sample else None,
                top_p=1.0 if sample else None,
                num_return_sequences=k,
                max_new_tokens=budget,
                min_new_tokens=budget,
                suppress_tokens=list(config.suppress_ids),
            )
        return [o.numpy() for o in out.cpu()]

    generate([steps[0].prefix_ids], steps[:1], 1, 1, False)  # warm-up
    t0 = time.perf_counter()
    seqs = [np.asarray(s.prefix_ids, np.int64) for s in steps]
    owners = list(steps)
    for t in range(1, NUM_TURNS + 1):
        if t > 1:
            seqs = [np.concatenate([q, o.turn_prompt_ids[t - 2]]) for q, o in zip(seqs, owners)]
        outs = generate(seqs, owners, br[t - 1], T[t - 1], sample=t < NUM_TURNS)
        assert all(len(o) == len(seqs[0]) + T[t - 1] for o in outs), "a turn stopped early"
        owners = [o for o in owners for _ in range(br[t - 1])]
        seqs = outs
    assert len(seqs) == len(steps) * num_leaves(br)
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------ main


def tree_config(cfg: Qwen2VLConfig, s: dict, steps: list[StepPrompts]) -> SamplerConfig:
    """The sampler settings of shape ``s`` with exact buckets for ``steps`` and an end id outside the vocabulary (no
    turn stops early: every method makes the same number of tokens)."""
    return SamplerConfig(
        branching=s["branching"],
        max_turn_tokens=s["turns"],
        temperature=(1.0, 1.0, 1.0, 0.0),
        eos_ids=(cfg.text.vocab_size,),
        suppress_ids=(cfg.image_token_id, cfg.video_token_id),
        prefix_buckets=(len(steps[0].prefix_ids),),
        prompt_buckets=tuple(sorted(set(s["prompts"]))),
        patch_buckets=(len(steps) * steps[0].pixel_values.shape[0],),
    )


def describe(shape: str, cfg, params, steps, config: SamplerConfig, matmul_n: int) -> dict:
    """The run's sizes, useful work and the matmul peak (f32, 4 independent ``matmul_n``-square products per
    call), printed; the figures' dict."""
    leaves = len(steps) * num_leaves(config.branching)
    flops = useful_tree_flops(cfg, steps, config)
    peak = harness.matmul_peak(jnp.float32, n=matmul_n, reps=4, products=4)
    res = {
        "shape": shape,
        "params": count_params(params),
        "steps": len(steps),
        "branching": list(config.branching),
        "turn_tokens": list(config.max_turn_tokens),
        "image_tokens_per_step": int(steps[0].pixel_values.shape[0] // cfg.vision.merge_factor),
        "prefix_tokens": len(steps[0].prefix_ids),
        "leaves": leaves,
        "useful_tflop": flops / 1e12,
        "matmul_peak_gflops": peak / 1e9,
        "devices": [str(d) for d in jax.devices()],
    }
    print(
        f"model {res['params'] / 1e6:.1f}M params, {res['image_tokens_per_step']} image tokens/step, "
        f"prefix {res['prefix_tokens']} tokens, branching {config.branching}, turns {config.max_turn_tokens}, "
        f"{len(steps)} step(s) -> {leaves} leaves; useful work {flops / 1e9:.1f} GFLOP; "
        f"matmul peak {peak / 1e9:.1f} GFLOP/s",
        flush=True,
    )
    return res


def time_ours(res: dict, params, cfg, steps, config: SamplerConfig) -> None:
    """(a) into ``res``: our sampler's warm call, its leaves/s and its share of the matmul peak; printed."""
    leaves, flops, peak = res["leaves"], res["useful_tflop"] * 1e12, res["matmul_peak_gflops"] * 1e9
    first, ours, tree = run_ours(params, cfg, steps, config)
    assert int(np.sum(np.asarray(tree.lengths[-1]))) == leaves * config.max_turn_tokens[-1]
    res.update(
        ours_seconds=ours,
        ours_first_call_seconds=first,
        ours_leaves_per_s=leaves / ours,
        ours_flops_fraction_of_peak=flops / ours / peak,
    )
    print(
        f"(a) ours (prefix sharing): {ours:.2f} s warm ({first:.1f} s first call incl. compile) -> "
        f"{leaves / ours:.2f} leaves/s, {flops / ours / 1e9:.1f} GFLOP/s = {100 * flops / ours / peak:.1f}% of "
        f"the matmul peak",
        flush=True,
    )


def time_baselines(res: dict, params, cfg, steps, config: SamplerConfig, no_sharing: bool, transformers: bool):
    """(b) no sharing (compilation subtracted) and (c) transformers' ``generate`` into ``res``, each against ours;
    printed."""
    leaves, ours = res["leaves"], res["ours_seconds"]
    if no_sharing:
        wall, run = run_no_sharing(params, cfg, steps, config, CompileSpans())
        res.update(
            no_sharing_seconds=run,
            no_sharing_wall_seconds=wall,
            no_sharing_leaves_per_s=leaves / run,
            ratio_vs_no_sharing=run / ours,
        )
        print(
            f"(b) no sharing: {run:.2f} s without compilation ({wall:.1f} s wall) -> {leaves / run:.2f} leaves/s; "
            f"ours is {run / ours:.2f}x faster",
            flush=True,
        )
    if transformers:
        with tempfile.TemporaryDirectory() as d:
            M.save_params(params, cfg, d)
            hf = run_transformers(d, cfg, steps, config)
        res.update(transformers_seconds=hf, transformers_leaves_per_s=leaves / hf, ratio_vs_transformers=hf / ours)
        print(
            f"(c) transformers generate: {hf:.2f} s -> {leaves / hf:.2f} leaves/s; ours is {hf / ours:.2f}x faster",
            flush=True,
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small model and tree (about a minute)")
    size.add_argument("--full", action="store_true", help="branching (3, 3, 3, 1): 27 leaves per step")
    size.add_argument("--tiny", action="store_true", help="the smallest model and tree (the test suite's run)")
    ap.add_argument("--steps", type=int, default=None, help="steps (trees) per batch")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-no-sharing", action="store_true")
    args = ap.parse_args(argv)

    shape = "quick" if args.quick else "full" if args.full else "tiny" if args.tiny else "default"
    s = SHAPES[shape]
    cfg = bench_model(s["size"])
    params = M.init_params(cfg, jax.random.PRNGKey(0), std=0.02)
    steps = random_steps(cfg, s, args.steps or s["steps"], np.random.default_rng(0))
    config = tree_config(cfg, s, steps)
    res = describe(shape, cfg, params, steps, config, matmul_n=256 if args.tiny else 2048)
    time_ours(res, params, cfg, steps, config)
    time_baselines(res, params, cfg, steps, config, not args.skip_no_sharing, not args.skip_transformers)
    if args.json:
        harness.write_json(args.json, res, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
