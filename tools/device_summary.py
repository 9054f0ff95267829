"""The accelerator check's one summary: the key figures of every part's JSON in ``DIR`` -> ``DIR/summary.json``.

    python -m tools.device_summary DIR [--seconds S]

Parts that failed or ran out of time appear with their exit status (from ``DIR/status.jsonl``) and the last lines
of their log, so a partial run still says what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KEYS = {
    "env": ("jax", "flax", "device", "cudnn_unavailable"),
    "parity": ("impl", "ok", "vision", "decoder", "packed", "sampler"),
    "mfu": (
        "attention_resolved",
        "remat",
        "step_s_median",
        "mfu",
        "hfu",
        "achieved_model_tflops",
        "matmul_flops_measured",
        "mfu_vs_measured_matmul",
        "memory_gb",
        "peak_memory_gb",
        "compile_s",
        "error",
    ),
    "mfu_profile": ("step_s_median", "profile", "error"),
    "mfu_before": ("attention_resolved", "remat", "step_s_median", "mfu", "hfu", "profile", "error"),
    "sampler": (
        "attention",
        "image_tokens_per_step",
        "leaves_per_s",
        "prefill_mfu",
        "decode_bound_ratio",
        "ratio_vs_transformers",
        "errors",
        "stopped",
    ),
    "job": ("architecture", "device", "stages", "sft", "tdpo", "seconds", "peak_device_bytes", "run_exit"),
}


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarize(out: Path, seconds: float | None) -> dict:
    status = {}
    for line in (out / "status.jsonl").read_text().splitlines() if (out / "status.jsonl").exists() else []:
        rec = json.loads(line)
        status[rec["part"]] = rec
    summary = {"seconds": seconds, "parts": {}}
    for name, rec in status.items():
        data = _load(out / f"{name}.json")
        entry = dict(rec)
        if data is None:
            log = out / f"{name}.log"
            entry["log_tail"] = log.read_text()[-1500:] if log.exists() else None
        elif name in KEYS:
            # a part's own figures never overwrite the runner's status (rc, seconds)
            entry.update({(k if k not in rec else f"{name}_{k}"): data[k] for k in KEYS[name] if k in data})
            if "profile" in entry and isinstance(entry["profile"], dict):
                prof = entry["profile"]
                entry["profile"] = {k: prof.get(k) for k in ("total_ms", "parts", "top_ops")}
        else:
            entry["result"] = data
        summary["parts"][name] = entry
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=None)
    args = ap.parse_args(argv)
    out = Path(args.out)
    summary = summarize(out, args.seconds)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for name, entry in summary["parts"].items():
        state = "skipped (budget)" if entry.get("skipped") else ("" if entry["rc"] == 0 else "(failed)")
        print(f"{name:14s} rc={entry['rc']} {int(entry['seconds']):4d}s", state)
    print(f"summary: {out / 'summary.json'} ({args.seconds} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
