"""The benchmarks' shared harness: timing, peak measurements, compiled memory, the matmul peak and JSON output.

Every timed call ends in ``jax.block_until_ready`` so that a time covers the device's work, not its dispatch::

    from tools import harness

    out, seconds = harness.timed(fn, x)  # one call (the first one includes its compile)
    times = harness.timings(fn, x, warmup=1, repeats=5)  # warm-up calls untimed, then one time per repeat
    harness.median_time(fn, x), harness.best_time(fn, x), harness.summary(times)  # {"min_s", "median_s", "all_s"}
    harness.compiled_memory(jitted.lower(x).compile())  # per-device bytes, as ``ipl-jax plan`` counts them
    harness.device_peak_bytes(), harness.rss_peak_bytes()  # high-water marks of this process
    harness.matmul_peak(jnp.bfloat16, n=8192)  # measured FLOP/s of a dense matmul
    harness.write_json(path, result)
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp


def timed(fn: Callable, *args) -> tuple[Any, float]:
    """``fn(*args)`` blocked until ready, and its wall seconds."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def timings(fn: Callable, *args, warmup: int = 1, repeats: int = 3) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn(*args)``, after ``warmup`` untimed calls (compiles, caches)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    return [timed(fn, *args)[1] for _ in range(repeats)]


def median_time(fn: Callable, *args, warmup: int = 1, repeats: int = 3) -> float:
    """Median of ``timings``: the typical call."""
    return statistics.median(timings(fn, *args, warmup=warmup, repeats=repeats))


def best_time(fn: Callable, *args, warmup: int = 1, repeats: int = 3) -> float:
    """Minimum of ``timings``: the least disturbed call (for peaks: FLOP/s, bytes/s)."""
    return min(timings(fn, *args, warmup=warmup, repeats=repeats))


def summary(times: list[float]) -> dict:
    """{"min_s", "median_s", "all_s"} of a list of seconds."""
    return {"min_s": min(times), "median_s": statistics.median(times), "all_s": list(times)}


def device_peak_bytes(device=None) -> int | None:
    """The device's peak bytes in use so far (``memory_stats()["peak_bytes_in_use"]``); None where the backend
    does not say (the CPU)."""
    stats = (device or jax.devices()[0]).memory_stats() or {}
    return int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None


def rss_peak_bytes() -> int:
    """This process's peak resident set size in bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def compiled_memory(compiled) -> dict | None:
    """Per-device bytes of a compiled program as ``ipl-jax plan`` counts them (``ipl_jax.planning.programs``:
    ``compiled_bytes``, ``total_bytes``): arguments, outputs, aliased, temporaries and total (= arguments +
    outputs + temporaries - aliased); None where the backend gives no memory analysis."""
    from ipl_jax.planning.programs import compiled_bytes, total_bytes

    if compiled.memory_analysis() is None:
        return None
    b = compiled_bytes(compiled)
    return {**b, "total": total_bytes(b["arguments"], b["outputs"], b["temporaries"], b["aliased"])}


def matmul_peak(dtype=jnp.float32, n: int = 2048, reps: int = 5, products: int = 1) -> float:
    """Best FLOP/s of ``products`` independent [n, n] @ [n, n] products in ``dtype`` per call, on the default
    device (one warm-up call, then the best of ``reps``)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * products)
    a = [jax.random.normal(k, (n, n), dtype) for k in keys[:products]]
    b = [jax.random.normal(k, (n, n), dtype) for k in keys[products:]]
    f = jax.jit(lambda a, b: [x @ y for x, y in zip(a, b)])
    return products * 2 * n**3 / best_time(f, a, b, warmup=1, repeats=reps)


def write_json(path, obj, indent: int | None = 1, default: Callable | None = None) -> str:
    """``obj`` as JSON into ``path`` (its folder made); returns the text."""
    text = json.dumps(obj, indent=indent, default=default)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def random_prefix(cfg, shape: dict, rng) -> list[int]:
    """A synthetic step's prefix of random text tokens around one image: ``shape``'s ``text_before`` tokens, the
    vision span of its ``grid`` (t, h, w patches, merged), ``text_after`` tokens."""
    t, h, w = shape["grid"]
    n_img = t * h * w // cfg.vision.merge_factor
    text = lambda k: rng.integers(10, cfg.image_token_id - 10, k).tolist()
    ids = text(shape["text_before"]) + [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img
    return ids + [cfg.vision_end_token_id] + text(shape["text_after"])
