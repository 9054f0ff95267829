"""Benchmark of the synthetic GUI world.

Measures, in one process (one core):
  * screens rendered per second (painting already-built screens), PNG encodes per second, and full
    simulator steps (expert decision + world step + annotation) per second;
  * the default dataset (every split at its default size, or scaled with --scale): episodes, steps, time to
    generate, time and megabytes to write in the AITZ format;
  * action-type shares, episode lengths, annotation lengths;
  * a screen-blind baseline: a policy that knows each click's target label and predicts that label's mean
    training position, scored with AITZ's 0.14 distance rule (how much the screen is needed).

    python -m tools.bench_synth [--scale 1.0] [--screens 400] [--json OUT] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ipl_jax.envs.synthetic import DEFAULT_SIZES, generate_split
from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
from ipl_jax.envs.synthetic.render import png_bytes


def bench_render(n_screens: int = 400) -> dict:
    """Screens painted per second, PNG encodes per second (at most 200 screens), and simulator steps per second
    over ``n_screens / 2`` episodes."""
    eps = generate_split("train", max(1, n_screens // 5), seed=99)
    painters = [s.image for e in eps for s in e.steps][:n_screens]
    for p in painters[:20]:
        p()  # warm the glyph caches, as a long generation run would be
    t = time.perf_counter()
    imgs = [p() for p in painters]
    render_s = time.perf_counter() - t
    t = time.perf_counter()
    for img in imgs[:200]:
        png_bytes(img, compress_level=6)
    png6 = (time.perf_counter() - t) / min(200, len(imgs))
    t = time.perf_counter()
    for img in imgs[:200]:
        png_bytes(img, compress_level=1)
    png1 = (time.perf_counter() - t) / min(200, len(imgs))
    t = time.perf_counter()
    more = generate_split("dev", max(1, n_screens // 2), seed=98)
    sim_s = time.perf_counter() - t
    n_sim = sum(len(e.steps) for e in more)
    return {
        "screens": len(imgs),
        "render_per_s": len(imgs) / render_s,
        "png6_per_s": 1 / png6,
        "png1_per_s": 1 / png1,
        "sim_steps_per_s_no_render": n_sim / sim_s,
    }


def blind_baseline(train, evals) -> dict:
    points = collections.defaultdict(list)
    for e in train:
        for s in e.steps:
            if s.action.type == "click":
                points[s.action.target].append(s.action.point)
    hits, n = collections.Counter(), collections.Counter()
    for e in evals:
        for s in e.steps:
            if s.action.type != "click":
                continue
            intent = s.meta["intent"]
            n[intent] += 1
            if points.get(s.action.target):
                guess = np.mean(points[s.action.target], axis=0)
                hits[intent] += float(np.hypot(*(guess - np.asarray(s.action.point)))) <= 0.14
    out = {k: round(hits[k] / n[k], 3) for k in sorted(n)}
    out["all_clicks"] = round(sum(hits.values()) / max(1, sum(n.values())), 3)
    return out


def write_splits(root: Path, scale: float, seed: int) -> tuple[dict, dict]:
    """Every split at ``scale`` times its default size, generated and written in the AITZ format under ``root``,
    each printed: (per-split figures, per-split episodes)."""
    splits, all_eps = {}, {}
    for name, size in DEFAULT_SIZES.items():
        n = max(1, round(size * scale))
        t = time.perf_counter()
        eps = generate_split(name, n, seed=seed)
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        split_dir = write_aitz_split(eps, root, name)
        write_s = time.perf_counter() - t
        mb = sum(f.stat().st_size for f in split_dir.rglob("*") if f.is_file()) / 2**20
        steps = sum(len(e.steps) for e in eps)
        splits[name] = {
            "episodes": n,
            "steps": steps,
            "generate_s": round(gen_s, 2),
            "write_s": round(write_s, 2),
            "mb": round(mb, 1),
        }
        all_eps[name] = eps
        print(f"{name}: {n} episodes, {steps} steps, generate {gen_s:.1f} s, write {write_s:.1f} s, {mb:.1f} MB")
    return splits, all_eps


def dataset_stats(splits: dict, all_eps: dict) -> dict:
    """The whole dataset's sizes and times, action shares, episode and annotation lengths."""
    eps = [e for v in all_eps.values() for e in v]
    steps = [s for e in eps for s in e.steps]
    total = collections.Counter(s.action.type for s in steps)
    n_steps = len(steps)
    return {
        "splits": splits,
        "episodes": len(eps),
        "steps": n_steps,
        "generate_s": round(sum(v["generate_s"] for v in splits.values()), 1),
        "write_s": round(sum(v["write_s"] for v in splits.values()), 1),
        "mb": round(sum(v["mb"] for v in splits.values()), 1),
        "action_shares": {k: round(v / n_steps, 3) for k, v in sorted(total.items())},
        "press_buttons": dict(collections.Counter(s.action.button for s in steps if s.action.type == "press")),
        "scroll_directions": dict(collections.Counter(s.action.direction for s in steps if s.action.type == "scroll")),
        "steps_per_episode": round(n_steps / len(eps), 2),
        "families": dict(collections.Counter(e.meta["task"]["family"] for e in eps)),
        "desc_words_mean": round(float(np.mean([len(s.coat.screen_desc.split()) for s in steps])), 1),
        "think_words_mean": round(float(np.mean([len(s.coat.action_think.split()) for s in steps])), 1),
        "elements_per_screen": round(float(np.mean([len(s.elements) for s in steps])), 1),
    }


def print_dataset(d: dict) -> None:
    print(
        f"default dataset: {d['episodes']} episodes, {d['steps']} steps, generate {d['generate_s']} s, "
        f"write {d['write_s']} s, {d['mb']} MB"
    )
    print("action shares: " + ", ".join(f"{k} {v:.1%}" for k, v in d["action_shares"].items()))
    print(f"press: {d['press_buttons']}; scroll: {d['scroll_directions']}; {d['steps_per_episode']} steps/episode")
    print(
        f"annotation words: description {d['desc_words_mean']}, thought {d['think_words_mean']}; "
        f"{d['elements_per_screen']} UI elements per screen"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the default split sizes")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--keep", default=None, help="write the dataset here and keep it (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--screens", type=int, default=400, help="screens the render benchmark paints")
    args = ap.parse_args(argv)

    out = {"render": bench_render(args.screens)}
    r = out["render"]
    print(
        f"render: {r['render_per_s']:.0f} screens/s (one core); PNG level 6: {r['png6_per_s']:.0f}/s, "
        f"level 1: {r['png1_per_s']:.0f}/s; simulator+expert+annotation: {r['sim_steps_per_s_no_render']:.0f} "
        f"steps/s"
    )
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="synth_bench_"))
    splits, all_eps = write_splits(root, args.scale, args.seed)
    out["dataset"] = dataset_stats(splits, all_eps)
    print_dataset(out["dataset"])
    evals = [e for k, v in all_eps.items() if k != "train" for e in v]
    out["blind_click_accuracy"] = blind_baseline(all_eps["train"], evals)
    print("screen-blind, label-aware click accuracy (0.14 rule): " + json.dumps(out["blind_click_accuracy"]))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
