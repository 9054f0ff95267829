"""Benchmark: T-DPO training throughput (pairs/s), prefix-packed vs unpacked vs TRL's DPOTrainer.

One run, one process, the same random weights (fp32) and the same preference pairs for all three:

  (a) packed: ``ipl.tdpo_step`` on ``packing.pack_round`` batches — one row per prefix node holding the prefix
      once and every continuation of it (β: 3 sibling actions, 2 pairs; γ: the golden action + 3 sampled
      ones, 3 pairs);
  (b) unpacked: the same step on ``packing.pack_unpacked`` batches — one row per (prefix, continuation), the
      prefix (screenshot included) repeated for every continuation;
  (c) TRL: ``DPOTrainer.training_step`` + its AdamW step on a ``Qwen2VLForConditionalGeneration`` loaded from
      the same weights (``save_params``), fed pre-tokenised rows in TRL's own layout (prompt + chosen, then prompt
      + rejected: two rows per pair, left-flushed, with ``completion_mask``); TRL runs its frozen reference model
      inside every step.

Our reference log-probs are computed once per round (``ipl.attach_reference``), one forward per batch; the
headline ratios therefore compare step + reference time per batch for (a)/(b) with TRL's step, which does
both. Step-only numbers are printed too. JAX programs are compiled ahead of time (``.lower().compile()``) and
not timed; every variant runs ``--repeats`` timed steps per batch, the median is reported.

TRL is not a project dependency. It runs if importable (``--trl-path DIR`` puts a directory with trl, datasets,
accelerate and their dependencies first on ``sys.path``); otherwise the TRL row says why it did not run.

    python tools/bench_tdpo.py [--quick] [--groups G] [--batches N] [--repeats R] [--json OUT] [--skip-trl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from bench_models import bench_model  # noqa: E402

from ipl_jax import model as M  # noqa: E402
from ipl_jax.model.config import Qwen2VLConfig  # noqa: E402
from ipl_jax.model.params import count_params  # noqa: E402
from ipl_jax.preference import packing as PK  # noqa: E402
from ipl_jax.preference import tdpo as ipl  # noqa: E402

# name -> model sizes and prefix / continuation lengths. "default": ~50M parameters, 529 image tokens per step;
# the prefix of a turn-3 pair is the screenshot, prompts and the sampled s1, s2 (~730 tokens).
SHAPES = {
    "default": dict(
        hidden=512,
        layers=8,
        heads=8,
        kv_heads=4,
        inter=2048,
        vocab=16384,
        v_dim=256,
        v_depth=4,
        v_heads=4,
        grid=(1, 46, 46),
        text_before=12,
        text_after=24,
        prompts=(40, 28),
        turns=(48, 48),
        action=(8, 16),
    ),
    "quick": dict(
        hidden=128,
        layers=2,
        heads=4,
        kv_heads=2,
        inter=256,
        vocab=2048,
        v_dim=64,
        v_depth=1,
        v_heads=2,
        grid=(1, 16, 16),
        text_before=8,
        text_after=12,
        prompts=(16, 12),
        turns=(16, 16),
        action=(4, 8),
    ),
}
TEXT_BUCKETS = tuple(range(64, 4097, 64))


def make_workload(cfg: Qwen2VLConfig, s: dict, groups_per_batch: int, n_batches: int, rng: np.random.Generator):
    """Groups alternate β (3 sampled actions; pairs 0≻1, 0≻2) and γ (golden + 3 sampled; golden ≻ each).
    Returns a list of (groups, pairs) per batch; every batch has the same number of groups and pairs."""
    t, h, w = s["grid"]
    n_img = t * h * w // cfg.vision.merge_factor
    eot = cfg.text.eos_token_id[0]
    text = lambda k: rng.integers(10, cfg.image_token_id - 10, k).tolist()  # noqa: E731
    out = []
    for _ in range(n_batches):
        groups, pairs = [], []
        for g in range(groups_per_batch):
            prefix = (
                text(s["text_before"])
                + [cfg.vision_start_token_id]
                + [cfg.image_token_id] * n_img
                + [cfg.vision_end_token_id]
                + text(s["text_after"])
            )
            for turn_len, prompt_len in zip(s["turns"], s["prompts"]):
                prefix += text(turn_len - 1) + [eot] + text(prompt_len)
            n_cont = 3 if g % 2 == 0 else 4
            conts = tuple(np.asarray(text(int(rng.integers(*s["action"]))) + [eot], np.int32) for _ in range(n_cont))
            groups.append(
                PK.PrefixGroup(
                    prefix_ids=np.asarray(prefix, np.int32),
                    continuations=conts,
                    pixel_values=rng.standard_normal((t * h * w, cfg.vision.patch_dim)).astype(np.float32),
                    image_grid_thw=np.asarray([[t, h, w]], np.int64),
                    name=f"bench group {g}",
                )
            )
            pairs += (
                [PK.PairRef(g, 0, 1, 3), PK.PairRef(g, 0, 2, 3)]
                if n_cont == 3
                else [PK.PairRef(g, 0, k, 3) for k in (1, 2, 3)]
            )
        out.append((groups, pairs))
    return out


def batch_tokens(batch: PK.PackedBatch) -> tuple[int, int]:
    """(real tokens, padded tokens) fed to the model by one packed batch."""
    seg = np.asarray(batch.segment_ids)
    return int(np.sum(seg >= 0)), int(seg.size)


def median(xs):
    return float(np.median(np.asarray(xs)))


# ------------------------------------------------------------------------------------------------ JAX variants


def time_jax(name: str, params, config: ipl.TDPOConfig, batches, repeats: int) -> dict:
    """Median seconds of one T-DPO step and one reference forward per batch (both compiled ahead of time)."""
    # the step donates its state: train a copy, so that ``params`` stays the shared starting point
    state = ipl.init_state(jax.tree.map(lambda x: x.copy(), params), config, jax.random.PRNGKey(0))
    step = ipl.make_tdpo_step(config)
    ref_fn = ipl._reference_jit
    t0 = time.perf_counter()
    step_exec = step.lower(state, batches[0]).compile()
    ref_exec = ref_fn.lower(params, batches[0], config.model, False, config.logp_chunk).compile()
    compile_s = time.perf_counter() - t0
    ref_times, step_times = [], []
    with_ref = []
    for batch in batches:
        for _ in range(repeats):
            t = time.perf_counter()
            rp, rn = ref_exec(params, batch)
            jax.block_until_ready((rp, rn))
            ref_times.append(time.perf_counter() - t)
        batch = batch.with_reference(np.asarray(rp), np.asarray(rn))
        with_ref.append(batch)
    for batch in with_ref:
        for _ in range(repeats):
            t = time.perf_counter()
            state, metrics = step_exec(state, batch)
            jax.block_until_ready(metrics)
            step_times.append(time.perf_counter() - t)
    pairs = with_ref[0].num_pairs
    real, padded = batch_tokens(with_ref[0])
    first_ref = (np.asarray(with_ref[0].ref_pos)[:pairs], np.asarray(with_ref[0].ref_neg)[:pairs])
    step_s, ref_s = median(step_times), median(ref_times)
    return {
        "variant": name,
        "rows": with_ref[0].rows,
        "T": with_ref[0].length,
        "pairs_per_step": pairs,
        "tokens_per_pair": real / pairs,
        "padded_tokens_per_pair": padded / pairs,
        "step_s": step_s,
        "reference_s": ref_s,
        "pairs_per_s": pairs / (step_s + ref_s),
        "pairs_per_s_step_only": pairs / step_s,
        "compile_s": compile_s,
        "loss": float(metrics["loss"]),
        "_first_ref": first_ref,
    }


# ------------------------------------------------------------------------------------------------ TRL


def trl_rows(cfg: Qwen2VLConfig, groups, pairs):
    """TRL's vision-preference layout for these pairs: rows [prompt + chosen_k] for every pair k, then
    [prompt + rejected_k]; right-padded (flush left); completion_mask on the completion tokens; one image per row."""
    import torch

    seqs, comp, pixels, grids = [], [], [], []
    for side in ("pos", "neg"):
        for p in pairs:
            g = groups[p.group]
            c = g.continuations[getattr(p, side)]
            seqs.append(np.concatenate([g.prefix_ids, c]))
            comp.append(np.concatenate([np.zeros(len(g.prefix_ids), np.int64), np.ones(len(c), np.int64)]))
            pixels.append(g.pixel_values)
            grids.append(g.image_grid_thw)
    width = max(len(x) for x in seqs)
    ids = np.zeros((len(seqs), width), np.int64)
    att = np.zeros_like(ids)
    cm = np.zeros_like(ids)
    for r, (x, c) in enumerate(zip(seqs, comp)):
        ids[r, : len(x)], att[r, : len(x)], cm[r, : len(x)] = x, 1, c
    mm = (ids == cfg.image_token_id).astype(np.int64)
    return (
        {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(att),
            "completion_mask": torch.from_numpy(cm),
            "mm_token_type_ids": torch.from_numpy(mm),
            "pixel_values": torch.from_numpy(np.concatenate(pixels)),
            "image_grid_thw": torch.from_numpy(np.concatenate(grids)),
        },
        int(att.sum()),
        int(att.size),
    )


def time_trl(
    cfg: Qwen2VLConfig, params, workload, config: ipl.TDPOConfig, repeats: int, tmp: str, our_ref=None
) -> dict:
    """Median seconds of DPOTrainer.training_step + optimizer.step per batch on the same weights and pairs
    (after one untimed warm-up step). ``our_ref``: (chosen, rejected) reference log-probs of the first batch's
    pairs from our packed forward; TRL's reference log-probs of the same pairs are compared with them."""
    try:
        import torch
        from datasets import Dataset
        from datasets.table import InMemoryTable
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast, Qwen2VLForConditionalGeneration
        from trl import DPOConfig, DPOTrainer
    except Exception as e:  # noqa: BLE001 - report any import problem
        return {"variant": "trl", "skipped": f"cannot import TRL and its dependencies: {type(e).__name__}: {e}"}

    model_dir = os.path.join(tmp, "weights")
    M.save_params(jax.device_get(params), cfg, model_dir)
    load = lambda: Qwen2VLForConditionalGeneration.from_pretrained(  # noqa: E731
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    model, ref_model = load(), load()
    # A word-level stand-in tokenizer: TRL needs one to build, but every batch here is already token ids.
    vocab = {"<pad>": 0, "<eos>": 1, "a": 2, "b": 3, "c": 4, "<unk>": 5}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
    )
    # built with an explicit fingerprint: datasets' own hashing of a new table fails with the pyarrow/dill pair
    # available here, and this one-row placeholder is never read (batches come from ``trl_rows``)
    dataset = Dataset(
        InMemoryTable.from_pydict({"prompt": ["a"], "chosen": ["b"], "rejected": ["c"]}),
        fingerprint="bench-placeholder",
    )
    args = DPOConfig(
        output_dir=os.path.join(tmp, "trl"),
        per_device_train_batch_size=1,
        learning_rate=1e-6,
        beta=config.dpo.beta,
        loss_type=["sigmoid"],
        max_length=None,
        gradient_checkpointing=False,
        report_to=[],
        bf16=False,
        fp16=False,
        use_cpu=True,
        disable_dropout=True,
        logging_steps=10**9,
        save_strategy="no",
        dataloader_num_workers=0,
    )

    class PreTokenizedDPOTrainer(DPOTrainer):
        """Batches arrive already tokenised (``trl_rows``): skip TRL's text-dataset tokenisation."""

        def _prepare_dataset(self, dataset, *args, **kwargs):
            return dataset

    trainer = PreTokenizedDPOTrainer(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        data_collator=lambda examples: examples,
    )
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train's loop, which we do not run
    trainer.model.train()
    parity = None
    inputs, _, _ = trl_rows(cfg, *workload[0])
    with torch.no_grad():
        ref_c, ref_r = trainer.compute_ref_log_probs(trainer.ref_model, inputs)
    if our_ref is not None:
        parity = float(max(np.max(np.abs(ref_c.numpy() - our_ref[0])), np.max(np.abs(ref_r.numpy() - our_ref[1]))))
    trainer.training_step(trainer.model, inputs)  # warm-up (allocator, kernels), not timed
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    times, real, padded, pairs, losses = [], 0, 0, 0, []
    for groups, prs in workload:
        inputs, real, padded = trl_rows(cfg, groups, prs)
        pairs = len(prs)
        for _ in range(repeats):
            t = time.perf_counter()
            loss = trainer.training_step(trainer.model, inputs)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t)
            losses.append(float(loss))
    step_s = median(times)
    return {
        "variant": "trl",
        "rows": 2 * pairs,
        "T": int(inputs["input_ids"].shape[1]),
        "pairs_per_step": pairs,
        "tokens_per_pair": real / pairs,
        "padded_tokens_per_pair": padded / pairs,
        "step_s": step_s,
        "reference_s": 0.0,
        "pairs_per_s": pairs / step_s,
        "pairs_per_s_step_only": pairs / step_s,
        "note": "reference forward runs inside the step",
        "loss": losses[0],
        "threads": torch.get_num_threads(),
        "max_abs_ref_logp_diff_vs_packed": parity,
    }


# ------------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small model (smoke test of the script)")
    parser.add_argument("--groups", type=int, default=2, help="prefix groups per batch (β, γ alternating)")
    parser.add_argument("--batches", type=int, default=1, help="distinct batches (same shapes)")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per batch")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--trl-path", default=None, help="directory put first on sys.path for trl & co")
    args = parser.parse_args(argv)
    if args.trl_path:
        sys.path.insert(0, os.path.abspath(args.trl_path))

    s = SHAPES["quick" if args.quick else "default"]
    cfg = bench_model(s)
    params = M.init_params(cfg, jax.random.PRNGKey(0), std=0.02)
    config = ipl.TDPOConfig(model=cfg, learning_rate=1e-6, logp_chunk=64)
    workload = make_workload(cfg, s, args.groups, args.batches, np.random.default_rng(0))
    n_pairs = len(workload[0][1])
    n_img = int(np.prod(s["grid"])) // cfg.vision.merge_factor
    print(
        f"model: {count_params(params) / 1e6:.1f}M parameters, {n_img} image tokens per step; "
        f"{args.groups} prefix groups and {n_pairs} pairs per step; jax {jax.__version__} on "
        f"{jax.devices()[0].platform}"
    )

    patch_bucket = int(np.prod(s["grid"]))  # per row: one screenshot
    packed = [
        PK.pack_round(
            cfg,
            g,
            p,
            PK.PackingConfig(
                rows=args.groups,
                max_continuations=4,
                max_pairs=n_pairs,
                text_buckets=TEXT_BUCKETS,
                patch_buckets=(patch_bucket,),
            ),
        )[0]
        for g, p in workload
    ]
    unpacked = []
    for g, p in workload:
        ug, up = PK.unpack_groups(g, p)
        rows = len(ug)
        unpacked += PK.pack_unpacked(
            cfg,
            ug,
            up,
            PK.PackingConfig(
                rows=rows,
                max_continuations=1,
                max_pairs=n_pairs,
                text_buckets=TEXT_BUCKETS,
                patch_buckets=(patch_bucket,),
            ),
        )
    results = [time_jax("packed", params, config, packed, args.repeats)]
    our_ref = results[0].pop("_first_ref")
    print(json.dumps(results[-1]))
    results.append(time_jax("unpacked", params, config, unpacked, args.repeats))
    unpacked_ref = results[-1].pop("_first_ref")
    results[-1]["max_abs_ref_logp_diff_vs_packed"] = float(
        max(np.max(np.abs(unpacked_ref[0] - our_ref[0])), np.max(np.abs(unpacked_ref[1] - our_ref[1])))
    )
    print(json.dumps(results[-1]))
    if args.skip_trl:
        results.append({"variant": "trl", "skipped": "--skip-trl"})
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(time_trl(cfg, params, workload, config, args.repeats, tmp, our_ref))
    print(json.dumps(results[-1]))

    by = {r["variant"]: r for r in results}
    ours = by["packed"]["pairs_per_s"]
    ratio = lambda other: (ours / by[other]["pairs_per_s"]) if "pairs_per_s" in by[other] else None  # noqa: E731
    summary = {
        "ratio_vs_unpacked": ratio("unpacked"),
        "ratio_vs_trl": ratio("trl"),
        "ratio_vs_unpacked_step_only": by["packed"]["pairs_per_s_step_only"] / by["unpacked"]["pairs_per_s_step_only"],
        "params": count_params(params),
        "image_tokens_per_step": n_img,
        "pairs_per_step": n_pairs,
        "results": results,
    }
    print()
    print(
        f"{'variant':10s} {'rows':>5s} {'T':>5s} {'tok/pair':>9s} {'pad tok/pair':>12s} {'step s':>8s} "
        f"{'ref s':>7s} {'pairs/s':>9s}"
    )
    for r in results:
        if "skipped" in r:
            print(f"{r['variant']:10s} skipped: {r['skipped']}")
            continue
        print(
            f"{r['variant']:10s} {r['rows']:5d} {r['T']:5d} {r['tokens_per_pair']:9.1f} "
            f"{r['padded_tokens_per_pair']:12.1f} {r['step_s']:8.2f} {r['reference_s']:7.2f} {r['pairs_per_s']:9.3f}"
        )
    print(
        f"packed vs unpacked: {summary['ratio_vs_unpacked']:.2f}x pairs/s "
        f"(step only {summary['ratio_vs_unpacked_step_only']:.2f}x); packed vs TRL: "
        + (f"{summary['ratio_vs_trl']:.2f}x" if summary["ratio_vs_trl"] is not None else "n/a")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
