"""Benchmark: the CoaT-tree sampler at Qwen2-VL-2B size on one accelerator, against transformers ``generate``.

Random weights of the real architecture (``--size 2b``) are drawn on the device in the compute dtype; ``--steps``
random prompts of a ``--screen`` screenshot resized by the processor rules under ``--max-pixels`` (one image slot
per step, as the job samples) with the CoaT prompts' text lengths. Parts, each written to ``--json`` when done:

  tree          ``sample_tree``: first call (compile), then a warm call -> leaves/s
  prefill       ``prefill_context`` alone on the same prompts -> model FLOPs / time / peak = MFU
  decode        ``sample_config_turn`` alone for ``--decode-turns`` at the tree's shapes -> time per token against
                the HBM bound (text weights + valid KV slots read per step / bandwidth); the last of them is
                timed again compiled with ``--decode-options`` (XLA) and traced with ``--profile``
  transformers  ``generate`` builds the same trees level by level in a subprocess (random weights made on its
                device, sdpa) -> leaves/s and our ratio over it

Peaks come from the device kind (or ``--peak-tflops`` / ``--hbm-gbps``; both are measured too). ``--time-limit``
is hard: at the limit the JSON (partial results, ``stopped``) is written and the process exits with 124.
``--size tiny`` runs every part on a small model on a CPU (about a minute, mostly compiling).

    python -m tools.bench_sampler_gpu [--size 2b|tiny] [--steps 4] [--turns 256,128,32,32] [--decode-turns 1,3]
                                      [--time-limit 90] [--skip-transformers] [--profile DIR] --json OUT
"""

from __future__ import annotations

import os

# the transformers subprocess shares the accelerator: JAX takes half of its memory instead of 75 %
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.coat.tree import NUM_TURNS, num_leaves, num_nodes
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.decode import KVCache
from ipl_jax.model.layers import resolve_attention
from ipl_jax.model.params import count_params, init_params
from ipl_jax.sampling import SamplerConfig, StepPrompts, pack_tree_prompts, sample_tree
from ipl_jax.sampling.decoding import prefill_context, sample_config_turn
from tools import harness
from tools.bench_models import bench_model
from tools.bench_tree import (
    CompileSpans,
    _span,
    _text_flops,
    _vision_flops,
    random_steps,
    useful_tree_flops,
)
from tools.gpu_mfu import spec_peak

HBM_BYTES_PER_S = {"h200": 4.8e12, "h100": 3.35e12, "a100": 2.0e12, "l4": 0.3e12}  # by device kind (SXM)
PARTS = ("tree", "prefill", "decode", "transformers")
REPO = Path(__file__).resolve().parents[1]  # the transformers worker runs as ``python -m tools.bench_sampler_gpu``
PROFILE_OPTIONS = {"xla_gpu_enable_command_buffer": ""}  # one trace event per kernel
TINY_MODEL = dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab=512, v_dim=32, v_depth=1, v_heads=2)
# per size: screenshot (width x height), pixel limit (the paper's 1280x720 on AMEX / AndroidControl; AITZ's
# 1540x1540 is --max-pixels 2371600), turn budgets, text around the image, turn-2..4 prompts (the CoaT template's)
DEFAULTS = {
    "2b": dict(screen="1080x2400", max_pixels=1280 * 720, turns="256,128,32,32", text="20,17", prompts="64,50,25"),
    "tiny": dict(screen="112x224", max_pixels=1280 * 720, turns="6,5,4,4", text="5,6", prompts="7,5,4"),
}


def _ints(text: str, n: int | None, flag: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if (n is not None and len(out) != n) or any(x < 1 for x in out):
        raise SystemExit(f"{flag}: expected {n or 'some'} positive integers, got {text!r}")
    return out


def model_config(size: str, dtype: str, attention: str) -> Qwen2VLConfig:
    """The real Qwen2-VL-2B architecture or the tiny test model, computing and storing weights in ``dtype``."""
    if size == "2b":
        from ipl_jax.pipeline.plan_shapes import ARCHITECTURES

        cfg = Qwen2VLConfig.from_hf_dict(ARCHITECTURES["qwen2-vl-2b"])
    else:
        cfg = bench_model(TINY_MODEL)
    return cfg.replace(dtype=dtype, param_dtype=dtype, attention=attention)


def make_steps(cfg: Qwen2VLConfig, n: int, screen, max_pixels: int, text, prompts, seed: int):
    """(n random steps, their grid): one screenshot grid (the processor's resize of ``screen`` (width, height)
    under ``max_pixels``), ``text`` (before, after) tokens around the image, turn-2..4 ``prompts`` lengths."""
    grid = ImageProcessorConfig(max_pixels=max_pixels).grid_for(screen[1], screen[0])
    shape = dict(grid=grid, text_before=text[0], text_after=text[1], prompts=prompts)
    return random_steps(cfg, shape, n, np.random.default_rng(seed)), grid


def sampler_config(cfg: Qwen2VLConfig, steps: list[StepPrompts], branching, turns) -> SamplerConfig:
    """The job's sampler settings with exact buckets and an end id outside the vocabulary (every turn runs its
    full budget, so every method makes the same number of tokens)."""
    patches = steps[0].pixel_values.shape[0]
    return SamplerConfig(
        branching=branching,
        max_turn_tokens=turns,
        temperature=(1.0, 1.0, 1.0, 0.0),
        eos_ids=(cfg.text.vocab_size,),
        suppress_ids=(cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id),
        prefix_buckets=(len(steps[0].prefix_ids),),
        prompt_buckets=tuple(sorted({len(p) for p in steps[0].turn_prompt_ids})),
        patch_buckets=(len(steps) * patches,),
        image_patches=patches,
    )


# ------------------------------------------------------------------------------------------------ figures


def decode_weight_bytes(params: dict, cfg: Qwen2VLConfig) -> int:
    """Bytes of the weights one decode step reads: every decoder layer, the final norm and the output head (the
    embedding matrix when tied); the embedding rows gathered for the fed tokens are left out."""
    model = params["model"]
    head = model["embed_tokens"]["embedding"] if cfg.tie_word_embeddings else params["lm_head"]["kernel"]
    leaves = jax.tree.leaves(model["layers"]) + jax.tree.leaves(model["norm"]) + [head]
    return int(sum(x.size * x.dtype.itemsize for x in leaves))


def kv_bytes_per_token(cfg: Qwen2VLConfig) -> int:
    t = cfg.text
    return 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * jnp.dtype(cfg.dtype).itemsize


def turn_shapes(config: SamplerConfig, batch: int, prefix_len: int, prompt_lens) -> list[dict]:
    """Per turn t: rows (nodes of level t), cache slots, and the cache length when its decode loop starts (the
    context but its last token: prefix - 1 + every earlier turn and prompt)."""
    out, context = [], prefix_len - 1
    for t in range(1, NUM_TURNS + 1):
        if t > 1:
            context += config.max_turn_tokens[t - 2] + prompt_lens[t - 2]
        out.append(
            dict(
                rows=batch * num_nodes(config.branching, t),
                slots=config.cache_size(prefix_len, prompt_lens, upto_turn=t),
                context=context,
                budget=config.max_turn_tokens[t - 1],
            )
        )
    return out


def hbm_bandwidth_measured(nbytes: int, reps: int = 5) -> float:
    """Best bytes/s of a jitted sum over a bfloat16 array of ``nbytes`` (one streaming read)."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    best = harness.best_time(f, x, warmup=1, repeats=reps)
    del x
    return nbytes / best


# ------------------------------------------------------------------------------------------------ parts


def run_tree(params, cfg, steps, config, res, clock: CompileSpans) -> None:
    leaves = len(steps) * num_leaves(config.branching)
    prompts = [jax.device_put(pack_tree_prompts(cfg, steps, config, seed)) for seed in (0, 1)]
    t0, c0 = time.perf_counter(), time.time()
    jax.block_until_ready(sample_tree(params, cfg, prompts[0], config))
    first, compile_s = time.perf_counter() - t0, clock.total(c0, time.time())
    tree, warm = harness.timed(sample_tree, params, cfg, prompts[1], config)
    made = int(np.sum(np.asarray(tree.lengths[-1]) == config.max_turn_tokens[-1]))
    if made != leaves:
        raise RuntimeError(f"the tree has {made} full-length leaves, expected {leaves}")
    flops = useful_tree_flops(cfg, steps, config)
    res["tree"] = dict(
        leaves=leaves,
        first_call_s=first,
        compile_s=compile_s,
        warm_s=warm,
        leaves_per_s=leaves / warm,
        useful_tflop=flops / 1e12,
        achieved_tflops=flops / warm / 1e12,
    )
    res["leaves_per_s"] = leaves / warm


def run_prefill(params, cfg, steps, config, res, reps: int) -> None:
    tp = pack_tree_prompts(cfg, steps, config, 0)
    prefix = jax.device_put(tp.prefix)
    prefix_len = tp.prefix.input_ids.shape[1]
    size = config.cache_size(prefix_len, [p.shape[1] for p in tp.turn_prompt_ids], upto_turn=1)
    t0 = time.perf_counter()
    compiled = jax.jit(lambda p, x: prefill_context(p, cfg, x, size)).lower(params, prefix).compile()
    compile_s = time.perf_counter() - t0
    sec = harness.median_time(compiled, params, prefix, warmup=1, repeats=reps)
    n = len(steps[0].prefix_ids) - 1  # the last prompt token is held back as the first decode feed
    flops = len(steps) * (_vision_flops(cfg, steps[0].pixel_values.shape[0]) + _text_flops(cfg, n, _span(0, n), 0))
    vision = len(steps) * _vision_flops(cfg, steps[0].pixel_values.shape[0])
    peak = res.get("peak_flops")
    res["prefill"] = dict(
        rows=len(steps),
        tokens=len(steps) * n,
        compile_s=compile_s,
        s=sec,
        model_tflop=flops / 1e12,
        vision_tflop=vision / 1e12,
        tflops=flops / sec / 1e12,
        mfu=flops / sec / peak if peak else None,
    )
    res["prefill_mfu"] = res["prefill"]["mfu"]


def _turn_program(params, cfg, config, shape: dict, temperature: float, options: dict | None = None):
    """(compiled, run, release): one turn's decode loop at the tree's shape (rows, cache slots, starting length,
    budget), compiled ahead with the XLA ``options``; ``run()`` decodes the turn once from the starting length
    (the cache is donated and comes back for the next call); ``release()`` frees the cache."""
    rows, slots, context = shape["rows"], shape["slots"], shape["context"]
    t = cfg.text

    @jax.jit
    def fresh():
        kv = (t.num_hidden_layers, rows, slots, t.num_key_value_heads, t.head_dim)
        k, v = (jnp.zeros(kv, jnp.dtype(cfg.dtype)) for _ in range(2))
        n = jnp.full((rows,), context, jnp.int32)
        return KVCache(k=k, v=v, length=n, next_pos=n)

    def turn(p, cache, feed, keys, temp):
        tok, n, lp, fin, cache, pending = sample_config_turn(p, cfg, cache, feed, keys, shape["budget"], temp, config)
        return cache, tok

    box = {"cache": fresh()}
    feed = jnp.full((rows,), 10, jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), rows)  # uint32[rows, 2], as the sampler's node keys
    temp = jnp.float32(temperature)
    lowered = jax.jit(turn, donate_argnums=(1,)).lower(params, box["cache"], feed, keys, temp)
    compiled = lowered.compile(compiler_options=options or None)

    def run():
        n = jnp.full((rows,), context, jnp.int32)  # new arrays: the donated cache takes its own with it
        box["cache"], tok = compiled(params, box["cache"].replace(length=n, next_pos=n + 0), feed, keys, temp)
        return box["cache"], tok

    return compiled, run, box.clear


def _timed_turn(params, cfg, config, shape, temperature, reps: int, options=None):
    """(compile seconds, median seconds of one turn, compiled, run, release) after one warm-up call."""
    t0 = time.perf_counter()
    compiled, run, release = _turn_program(params, cfg, config, shape, temperature, options)
    compile_s = time.perf_counter() - t0
    return compile_s, harness.median_time(run, warmup=1, repeats=reps), compiled, run, release


def _profile_turn(params, cfg, config, shape, temperature, trace_dir: str) -> dict:
    """Where one turn's device time goes: the turn compiled without XLA's command buffers (which would report a
    layer's kernels as one event), traced for one call: kernel milliseconds by part and the top instructions
    (``xla_profile.profile_parts``), and the fraction of the call's wall time the device was busy."""
    from tools.xla_profile import profile_parts

    try:
        compiled, run, release = _turn_program(params, cfg, config, shape, temperature, PROFILE_OPTIONS)
        jax.block_until_ready(run())
        wall = []

        def call():
            t0 = time.perf_counter()
            jax.block_until_ready(run())
            wall.append(time.perf_counter() - t0)

        prof = profile_parts(compiled.as_text(), call, 1, trace_dir, top=12)
        release()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if "total_ms" in prof:
        prof.update(wall_ms=wall[0] * 1e3, busy_fraction=prof["total_ms"] / 1e3 / wall[0])
    return dict(prof, compiler_options=PROFILE_OPTIONS)


def run_decode(params, cfg, steps, config, res, turns, reps: int, options: dict, profile: str | None) -> None:
    prompt_lens = [len(p) for p in steps[0].turn_prompt_ids]
    shapes = turn_shapes(config, len(steps), len(steps[0].prefix_ids), prompt_lens)
    weights, per_token = res["decode_weight_bytes"], res["kv_bytes_per_token"]
    bandwidth = res["hbm_bytes_per_s"]
    out = res.setdefault("decode", {})
    for i, t in enumerate(turns):
        s = shapes[t - 1]
        temperature = config.temperature[t - 1]
        compile_s, turn_s, _, _, release = _timed_turn(params, cfg, config, s, temperature, reps)
        mean_context = s["context"] + (s["budget"] + 1) / 2  # cache slots read, the new token included
        step_bytes = weights + s["rows"] * mean_context * per_token
        bound_s = step_bytes / bandwidth
        step_s = turn_s / s["budget"]
        out[f"turn{t}"] = entry = dict(
            s,
            mean_context=mean_context,
            compile_s=compile_s,
            turn_s=turn_s,
            step_s=step_s,
            bytes_per_step=step_bytes,
            bound_s=bound_s,
            bound_over_step=bound_s / step_s,
        )
        release()
        last = i == len(turns) - 1
        if profile and last:
            res["decode_profile"] = dict(_profile_turn(params, cfg, config, s, temperature, profile), turn=t)
        if options and last:  # the same turn compiled with other XLA options
            _, alt_s, _, _, release = _timed_turn(params, cfg, config, s, temperature, reps, options)
            release()
            entry.update(options_step_s=alt_s / s["budget"], options_bound_over_step=bound_s * s["budget"] / alt_s)
        # over the turns timed so far: bound time / actual time of their whole decode loops
        done = list(out.values())
        res["decode_bound_ratio"] = sum(v["bound_s"] * v["budget"] for v in done) / sum(v["turn_s"] for v in done)


def _options(text: str) -> dict:
    """'key=value,...' -> XLA compiler options (true / false and integers converted)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SystemExit(f"--decode-options: expected key=value,..., got {text!r}")
        v = value.strip()
        out[key.strip()] = {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)
    return out


def run_transformers(cfg, steps, config, res, args, deadline: float | None, box: dict) -> None:
    """The transformers tree in a subprocess (its own accelerator context, killed at the deadline)."""
    with tempfile.TemporaryDirectory() as d:
        np.savez(
            Path(d) / "prompts.npz",
            prefix=np.stack([s.prefix_ids for s in steps]),
            pixels=np.stack([s.pixel_values for s in steps]),
            grids=np.stack([s.image_grid_thw for s in steps]),
            **{f"prompt{t}": np.stack([s.turn_prompt_ids[t] for s in steps]) for t in range(3)},
        )
        spec = dict(
            size=args.size,
            dtype=args.dtype,
            branching=list(config.branching),
            turns=list(config.max_turn_tokens),
            seed=args.seed,
        )
        (Path(d) / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, JAX_PLATFORMS="cpu")  # the worker never touches the accelerator through JAX
        cmd = [sys.executable, "-m", "tools.bench_sampler_gpu", "--transformers-worker", d]
        timeout = None if deadline is None else max(1.0, deadline - time.monotonic() - 2.0)
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        box["child"] = proc
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
            raise RuntimeError(f"transformers did not finish within {timeout:.0f} s: {log[-1500:]}") from None
        finally:
            box.pop("child", None)
        found = Path(d) / "result.json"
        if proc.returncode or not found.is_file():
            raise RuntimeError(f"transformers worker exited with {proc.returncode}: {log[-3000:]}")
        hf = json.loads(found.read_text())
    leaves = len(steps) * num_leaves(config.branching)
    hf["leaves_per_s"] = leaves / hf["s"]
    res["transformers"] = hf
    if "tree" in res:
        res["ratio_vs_transformers"] = hf["s"] / res["tree"]["warm_s"]


def transformers_worker(d: str) -> int:
    """The subprocess side of ``run_transformers``: random weights of the same architecture made directly on the
    device (bf16 on a GPU), then the level-by-level ``generate`` tree."""
    import torch
    import transformers
    from transformers import Qwen2VLConfig as HFQwen2VLConfig
    from transformers import Qwen2VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from tools.bench_tree import transformers_tree_seconds

    hf_logging.set_verbosity_error()
    spec = json.loads((Path(d) / "spec.json").read_text())
    data = np.load(Path(d) / "prompts.npz")
    cfg = model_config(spec["size"], spec["dtype"], "reference")
    steps = [
        StepPrompts(
            prefix_ids=data["prefix"][i],
            turn_prompt_ids=tuple(data[f"prompt{t}"][i] for t in range(3)),
            pixel_values=data["pixels"][i],
            image_grid_thw=data["grids"][i],
            uid=i,
        )
        for i in range(data["prefix"].shape[0])
    ]
    config = sampler_config(cfg, steps, tuple(spec["branching"]), tuple(spec["turns"]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(spec["seed"])
    t0 = time.perf_counter()
    with torch.device(device):
        model = Qwen2VLForConditionalGeneration._from_config(
            HFQwen2VLConfig(**cfg.to_hf_dict()), dtype=getattr(torch, spec["dtype"]), attn_implementation="sdpa"
        ).eval()
    init_s = time.perf_counter() - t0
    sec = transformers_tree_seconds(model, cfg, steps, config, device=device)
    out = dict(
        s=sec,
        init_s=init_s,
        device=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__,
        transformers=transformers.__version__,
        dtype=spec["dtype"],
        attn_implementation="sdpa",
    )
    (Path(d) / "result.json").write_text(json.dumps(out))
    return 0


# ------------------------------------------------------------------------------------------------ main


class Report:
    """The results dict, written whole (atomically) after each part and once more when the time limit stops the
    run; a watchdog thread enforces ``--time-limit`` even inside a compile or a device call."""

    def __init__(self, path: str | None, limit: float | None):
        self.res: dict = {"parts_done": [], "errors": {}, "stopped": None}
        self.path, self.part, self.box = path, "setup", {}
        self.t0 = time.monotonic()
        self.deadline = None if not limit else self.t0 + limit
        self.lock = threading.Lock()
        if self.deadline is not None:
            threading.Thread(target=self._watch, daemon=True).start()

    def write(self) -> None:
        with self.lock:
            self.res["wall_s"] = time.monotonic() - self.t0
            text = json.dumps(self.res, indent=2, default=float)
            if self.path:
                tmp = f"{self.path}.tmp"
                Path(tmp).write_text(text)
                os.replace(tmp, self.path)
        return text

    def _watch(self) -> None:
        time.sleep(max(0.0, self.deadline - time.monotonic()))
        try:
            child = self.box.get("child")
            if child is not None:
                child.kill()
            self.res["stopped"] = f"time limit reached during {self.part}"
            for _ in range(3):  # the main thread may be adding a result while this one serialises
                try:
                    self.write()
                    break
                except RuntimeError:
                    time.sleep(0.05)
            print(f"time limit reached during {self.part}", flush=True)
        finally:
            os._exit(124)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=tuple(DEFAULTS), default="2b")
    ap.add_argument("--steps", type=int, default=4, help="steps (trees) per sampler batch")
    ap.add_argument("--branching", default="3,3,3,1")
    ap.add_argument("--turns", default=None, help="turn budgets T1..T4 (default: the paper's 256,128,32,32)")
    ap.add_argument("--screen", default=None, help="screenshot WIDTHxHEIGHT before the resize (1080x2400)")
    ap.add_argument("--max-pixels", type=int, default=None, help="the processor's pixel limit (921600)")
    ap.add_argument("--text", default=None, help="text tokens before,after the image in the first prompt")
    ap.add_argument("--prompts", default=None, help="turn-2,3,4 prompt tokens")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--attention", default="auto", help="model.attention (auto, reference, xla, cudnn)")
    ap.add_argument("--decode-turns", default="1,3", help="turns whose decode loop is timed alone ('' = none)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls of the prefill and of each decode turn")
    ap.add_argument(
        "--decode-options",
        default="",
        help="XLA compiler options key=value,...: the last decode turn is timed again compiled with them",
    )
    ap.add_argument("--profile", default=None, help="trace the last decode turn into this folder (kernel times)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to run")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the chip's bf16 peak (default: by kind)")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth in GB/s (default: by kind)")
    ap.add_argument("--time-limit", type=float, default=None, help="hard limit in seconds for the whole run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here (after every part)")
    ap.add_argument("--transformers-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.transformers_worker:
        return transformers_worker(args.transformers_worker)
    for k, v in DEFAULTS[args.size].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    parts = [p for p in args.parts.split(",") if p]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        raise SystemExit(f"--parts: unknown {','.join(bad)} (valid: {','.join(PARTS)})")
    if args.skip_transformers and "transformers" in parts:
        parts.remove("transformers")
    decode_turns = _ints(args.decode_turns, None, "--decode-turns") if args.decode_turns else ()
    if any(t > NUM_TURNS for t in decode_turns):
        raise SystemExit(f"--decode-turns: turns are 1..{NUM_TURNS}, got {args.decode_turns!r}")
    if args.steps < 1 or args.reps < 1 or args.max_pixels < 1:
        raise SystemExit("--steps, --reps and --max-pixels must be >= 1")
    branching, turns = _ints(args.branching, NUM_TURNS, "--branching"), _ints(args.turns, NUM_TURNS, "--turns")
    screen = _ints(args.screen.replace("x", ","), 2, "--screen")
    decode_options = _options(args.decode_options)
    text, prompts = _ints(args.text, 2, "--text"), _ints(args.prompts, 3, "--prompts")

    clock = CompileSpans()
    rep = Report(args.json, args.time_limit)
    res = rep.res
    try:
        dev = jax.devices()[0]
        cfg = model_config(args.size, args.dtype, args.attention)
        steps, grid = make_steps(cfg, args.steps, screen, args.max_pixels, text, prompts, args.seed)
        config = sampler_config(cfg, steps, branching, turns)
        kind = dev.device_kind.lower()
        spec_bw = next((bw for k, bw in HBM_BYTES_PER_S.items() if k in kind), None)
        gpu = dev.platform == "gpu"
        measured_bw = hbm_bandwidth_measured(2**30 if gpu else 2**27)
        measured_peak = harness.matmul_peak(jnp.dtype(args.dtype), n=8192 if gpu else 512)
        peak = args.peak_tflops * 1e12 if args.peak_tflops else spec_peak(dev) or measured_peak
        res.update(
            size=args.size,
            device=dev.device_kind,
            platform=dev.platform,
            jax=jax.__version__,
            python=platform.python_version(),
            dtype=args.dtype,
            attention_setting=args.attention,
            attention=resolve_attention(args.attention, cfg.dtype, (cfg.text.head_dim, cfg.vision.head_dim)),
            jax_mem_fraction=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
            xla_flags=os.environ.get("XLA_FLAGS", ""),
            decode_options=decode_options,
            steps=args.steps,
            branching=list(branching),
            turn_tokens=list(turns),
            leaves=args.steps * num_leaves(branching),
            screen=args.screen,
            max_pixels=args.max_pixels,
            grid=list(grid),
            patches_per_step=int(np.prod(grid)),
            image_tokens_per_step=int(np.prod(grid)) // cfg.vision.merge_factor,
            prefix_tokens=len(steps[0].prefix_ids),
            prompt_tokens=[len(p) for p in steps[0].turn_prompt_ids],
            peak_flops=peak,
            peak_source="--peak-tflops" if args.peak_tflops else ("device kind" if spec_peak(dev) else "measured"),
            matmul_flops_measured=measured_peak,
            hbm_bytes_per_s_measured=measured_bw,
            hbm_bytes_per_s=args.hbm_gbps * 1e9 if args.hbm_gbps else spec_bw or measured_bw,
            hbm_source="--hbm-gbps" if args.hbm_gbps else ("device kind" if spec_bw else "measured"),
        )
        t0 = time.perf_counter()
        params = jax.block_until_ready(jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(args.seed)))
        res.update(
            init_s=time.perf_counter() - t0,
            params=count_params(params),
            decode_weight_bytes=decode_weight_bytes(params, cfg),
            kv_bytes_per_token=kv_bytes_per_token(cfg),
        )
    except Exception as e:
        res["errors"]["setup"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        print(rep.write())
        return 1
    rep.write()
    print(
        f"{res['params'] / 1e9:.2f}B params on {res['device']}, attention {res['attention']}; {args.steps} steps x "
        f"{res['image_tokens_per_step']} image tokens, prefix {res['prefix_tokens']}, turns {turns} -> "
        f"{res['leaves']} leaves",
        flush=True,
    )
    runners = {
        "tree": lambda: run_tree(params, cfg, steps, config, res, clock),
        "prefill": lambda: run_prefill(params, cfg, steps, config, res, args.reps),
        "decode": lambda: run_decode(
            params, cfg, steps, config, res, decode_turns, args.reps, decode_options, args.profile
        ),
        "transformers": lambda: run_transformers(cfg, steps, config, res, args, rep.deadline, rep.box),
    }
    for part in parts:
        rep.part = part
        try:
            runners[part]()
            res["parts_done"].append(part)
        except Exception as e:
            res["errors"][part] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        print(f"{part}: {json.dumps(res.get(part, res['errors'].get(part)), default=float)[:600]}", flush=True)
        rep.write()
    headline = ("leaves_per_s", "prefill_mfu", "decode_bound_ratio", "ratio_vs_transformers")
    print(json.dumps({k: res.get(k) for k in headline}), flush=True)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
