"""The sampler benchmark's ``decode`` part (``python -m tools.bench_sampler_gpu``): one turn's decode loop at the
tree's shape, timed alone against its HBM bound, optionally again with other XLA options, and traced."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from ipl_jax.model.decode import KVCache
from ipl_jax.sampling.decoding import sample_config_turn
from tools import harness
from tools.sampler_roofline import turn_shapes

PROFILE_OPTIONS = {"xla_gpu_enable_command_buffer": ""}  # one trace event per kernel


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
