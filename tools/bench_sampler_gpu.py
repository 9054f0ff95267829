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
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.coat.tree import NUM_TURNS, num_leaves
from ipl_jax.model.layers import resolve_attention
from ipl_jax.model.params import count_params, init_params
from ipl_jax.sampling.decoding import prefill_context
from ipl_jax.sampling.prompts import pack_tree_prompts
from ipl_jax.sampling.tree_sampler import sample_tree
from tools import harness
from tools.bench_tree import CompileSpans, _span, _text_flops, _vision_flops, useful_tree_flops
from tools.gpu_mfu import spec_peak
from tools.sampler_gpu_decode import run_decode
from tools.sampler_gpu_setup import DEFAULTS, make_steps, model_config, sampler_config
from tools.sampler_gpu_transformers import run_transformers, transformers_worker
from tools.sampler_roofline import HBM_BYTES_PER_S, decode_weight_bytes, hbm_bandwidth_measured, kv_bytes_per_token

PARTS = ("tree", "prefill", "decode", "transformers")


def _ints(text: str, n: int | None, flag: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if (n is not None and len(out) != n) or any(x < 1 for x in out):
        raise SystemExit(f"{flag}: expected {n or 'some'} positive integers, got {text!r}")
    return out


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


def parse_args(argv) -> argparse.Namespace:
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
    return ap.parse_args(argv)


class Flags(NamedTuple):
    """The list-valued flags, parsed and checked."""

    parts: list[str]
    decode_turns: tuple[int, ...]
    branching: tuple[int, ...]
    turns: tuple[int, ...]
    screen: tuple[int, ...]
    decode_options: dict
    text: tuple[int, ...]
    prompts: tuple[int, ...]


def read_flags(args: argparse.Namespace) -> Flags:
    """``args`` with the ``--size``'s defaults filled in, the list-valued flags parsed; a bad flag is one line
    (``SystemExit``)."""
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
    return Flags(parts, decode_turns, branching, turns, screen, decode_options, text, prompts)


def peak_figures(dev, args: argparse.Namespace) -> dict:
    """The matmul peak (FLOP/s) and HBM bandwidth (bytes/s) the figures divide by: ``--peak-tflops`` /
    ``--hbm-gbps``, else the device kind's, else measured (both are measured either way), with their sources."""
    kind = dev.device_kind.lower()
    spec_bw = next((bw for k, bw in HBM_BYTES_PER_S.items() if k in kind), None)
    gpu = dev.platform == "gpu"
    measured_bw = hbm_bandwidth_measured(2**30 if gpu else 2**27)
    measured_peak = harness.matmul_peak(jnp.dtype(args.dtype), n=8192 if gpu else 512)
    return dict(
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else spec_peak(dev) or measured_peak,
        peak_source="--peak-tflops" if args.peak_tflops else ("device kind" if spec_peak(dev) else "measured"),
        matmul_flops_measured=measured_peak,
        hbm_bytes_per_s_measured=measured_bw,
        hbm_bytes_per_s=args.hbm_gbps * 1e9 if args.hbm_gbps else spec_bw or measured_bw,
        hbm_source="--hbm-gbps" if args.hbm_gbps else ("device kind" if spec_bw else "measured"),
    )


def setup(args: argparse.Namespace, flags: Flags, res: dict) -> tuple:
    """(cfg, steps, sampler config, params): the model, the random steps and the device's figures written into
    ``res``, then the random weights drawn on the device (timed)."""
    dev = jax.devices()[0]
    cfg = model_config(args.size, args.dtype, args.attention)
    steps, grid = make_steps(cfg, args.steps, flags.screen, args.max_pixels, flags.text, flags.prompts, args.seed)
    config = sampler_config(cfg, steps, flags.branching, flags.turns)
    peaks = peak_figures(dev, args)
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
        decode_options=flags.decode_options,
        steps=args.steps,
        branching=list(flags.branching),
        turn_tokens=list(flags.turns),
        leaves=args.steps * num_leaves(flags.branching),
        screen=args.screen,
        max_pixels=args.max_pixels,
        grid=list(grid),
        patches_per_step=int(np.prod(grid)),
        image_tokens_per_step=int(np.prod(grid)) // cfg.vision.merge_factor,
        prefix_tokens=len(steps[0].prefix_ids),
        prompt_tokens=[len(p) for p in steps[0].turn_prompt_ids],
        **peaks,
    )
    t0 = time.perf_counter()
    params = jax.block_until_ready(jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(args.seed)))
    res.update(
        init_s=time.perf_counter() - t0,
        params=count_params(params),
        decode_weight_bytes=decode_weight_bytes(params, cfg),
        kv_bytes_per_token=kv_bytes_per_token(cfg),
    )
    return cfg, steps, config, params


def run_parts(parts: list[str], runners: dict, rep: Report) -> None:
    """Each part in turn: its result (or its error, which does not stop the others) printed and written."""
    res = rep.res
    for part in parts:
        rep.part = part
        try:
            runners[part]()
            res["parts_done"].append(part)
        except Exception as e:
            res["errors"][part] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        print(f"{part}: {json.dumps(res.get(part, res['errors'].get(part)), default=float)[:600]}", flush=True)
        rep.write()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.transformers_worker:
        return transformers_worker(args.transformers_worker)
    flags = read_flags(args)
    clock = CompileSpans()
    rep = Report(args.json, args.time_limit)
    res = rep.res
    try:
        cfg, steps, config, params = setup(args, flags, res)
    except Exception as e:
        res["errors"]["setup"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        print(rep.write())
        return 1
    rep.write()
    print(
        f"{res['params'] / 1e9:.2f}B params on {res['device']}, attention {res['attention']}; {args.steps} steps x "
        f"{res['image_tokens_per_step']} image tokens, prefix {res['prefix_tokens']}, turns {flags.turns} -> "
        f"{res['leaves']} leaves",
        flush=True,
    )
    runners = {
        "tree": lambda: run_tree(params, cfg, steps, config, res, clock),
        "prefill": lambda: run_prefill(params, cfg, steps, config, res, args.reps),
        "decode": lambda: run_decode(
            params, cfg, steps, config, res, flags.decode_turns, args.reps, flags.decode_options, args.profile
        ),
        "transformers": lambda: run_transformers(cfg, steps, config, res, args, rep.deadline, rep.box),
    }
    run_parts(flags.parts, runners, rep)
    headline = ("leaves_per_s", "prefill_mfu", "decode_bound_ratio", "ratio_vs_transformers")
    print(json.dumps({k: res.get(k) for k in headline}), flush=True)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
