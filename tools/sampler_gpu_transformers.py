"""The sampler benchmark's ``transformers`` part (``python -m tools.bench_sampler_gpu``): ``generate`` builds the
same trees level by level in a subprocess, ``python -m tools.bench_sampler_gpu --transformers-worker DIR``, whose
side is ``transformers_worker`` (random weights made on its device, sdpa)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ipl_jax.coat.tree import num_leaves
from ipl_jax.sampling.prompts import StepPrompts
from tools.sampler_gpu_setup import model_config, sampler_config

REPO = Path(__file__).resolve().parents[1]  # the worker runs as ``python -m tools.bench_sampler_gpu``


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
