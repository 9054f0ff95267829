"""Benchmark of the SFT input pipeline: the published format vs ArrayRecord shards, side by side.

One synthetic training split is written in the AITZ layout and packed with ``pack_dataset``; then, for each
source and for 1 and 2 reader threads, the SFT input pipeline runs in this process:

    read the split -> SFT items -> grain MapDataset (shuffle, repeat) -> CoaT example (screenshot decoded,
    resized, patched; chat tokenised) -> collate to fixed buckets -> iterator with N threads

Sources: ``aitz`` (the published layout, ``load_aitz``: JSON files + one PNG per step), ``arrayrecord``
(``load_packed``: episodes rebuilt from the shards, screenshots read from the records on use) and
``arrayrecord-source`` (``open_split`` handed to grain directly: each step decoded from its record in the reading
threads; nothing read up front). Reported: first-batch latency (reading the split + building the pipeline +
the first batch) and steady-state batches/s over the next ``--batches``; ratios are against ``aitz`` with the
same thread count.

    nice python -m tools.bench_data [--episodes 40] [--batches 20] [--batch-size 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ipl_jax.data.aitz import load_aitz
from ipl_jax.data.batching import collate
from ipl_jax.data.dialogue import coat_example
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.packed.reader import load_packed, open_split
from ipl_jax.data.packed.writer import pack_dataset
from ipl_jax.data.pipeline import make_dataset, make_iterator

IMAGE_CFG = ImageProcessorConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
TOKEN_BUCKETS = (512, 1024, 2048, 4096)
SOURCES = ("aitz", "arrayrecord", "arrayrecord-source")


def tokenizer(work: Path):
    from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer, write_tokenizer
    from ipl_jax.data.tokenizer import load_tokenizer

    write_tokenizer(train_tokenizer(default_corpus(n_lines=400), vocab_size=700), work / "tok")
    return load_tokenizer(work / "tok")


def steps_of(source: str, aitz_root: Path, packed: Path):
    """The training steps as the SFT stage gets them (a random-access sequence)."""
    if source == "aitz":
        return [s for e in load_aitz(aitz_root, "train") for s in e.steps]
    if source == "arrayrecord":
        return [s for e in load_packed(packed, "train") for s in e.steps]
    return open_split(packed, "train", process_index=0, process_count=1)


def run(source: str, threads: int, aitz_root: Path, packed: Path, tok, batch_size: int, batches: int) -> dict:
    patch_buckets = tuple(p * batch_size for p in (64, 128, 256))

    def batch_fn(examples):
        return collate(list(examples), TOKEN_BUCKETS, patch_buckets, tok.ids.pad, batch_size=batch_size)

    t0 = time.perf_counter()
    steps = steps_of(source, aitz_root, packed)
    ds = make_dataset(
        steps,
        lambda s: coat_example(s, tok, IMAGE_CFG),
        batch_size=batch_size,
        seed=0,
        num_epochs=None,
        batch_fn=batch_fn,
    )
    it = make_iterator(ds, num_threads=threads, prefetch_buffer_size=4)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches / (time.perf_counter() - t1)
    return {
        "source": source,
        "threads": threads,
        "first_batch_s": first,
        "batches_per_s": rate,
        "steps_per_s": rate * batch_size,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=40, help="synthetic training episodes")
    p.add_argument("--batches", type=int, default=20, help="batches timed after the first")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)

    from ipl_jax.envs.synthetic import generate_split
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split

    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        write_aitz_split(generate_split("train", args.episodes, seed=0), work / "aitz", "train", with_meta=True)
        t_write = time.perf_counter() - t
        t = time.perf_counter()
        meta = pack_dataset("synthetic", work / "aitz", work / "packed", shards=args.shards)
        t_pack = time.perf_counter() - t
        n_steps = meta["splits"]["train"]["steps"]
        size = lambda d: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        print(
            f"{args.episodes} episodes, {n_steps} steps; AITZ layout {size(work / 'aitz') / 1e6:.1f} MB written "
            f"in {t_write:.1f} s; packed to {args.shards} shards, {size(work / 'packed') / 1e6:.1f} MB in "
            f"{t_pack:.1f} s; batch size {args.batch_size}, {args.batches} timed batches"
        )
        tok = tokenizer(work)
        run("aitz", 1, work / "aitz", work / "packed", tok, args.batch_size, 2)  # warm-up: imports, caches
        results = []
        for threads in (1, 2):
            for source in SOURCES:
                results.append(run(source, threads, work / "aitz", work / "packed", tok, args.batch_size, args.batches))
    base = {r["threads"]: r for r in results if r["source"] == "aitz"}
    print(f"\n{'source':<20}{'threads':>8}{'first batch s':>15}{'x aitz':>8}{'steps/s':>10}{'x aitz':>8}")
    for r in results:
        b = base[r["threads"]]
        r["first_batch_ratio"] = r["first_batch_s"] / b["first_batch_s"]
        r["steps_per_s_ratio"] = r["steps_per_s"] / b["steps_per_s"]
        print(
            f"{r['source']:<20}{r['threads']:>8}{r['first_batch_s']:>15.3f}{r['first_batch_ratio']:>8.2f}"
            f"{r['steps_per_s']:>10.1f}{r['steps_per_s_ratio']:>8.2f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"episodes": args.episodes, "steps": n_steps, "results": results}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
