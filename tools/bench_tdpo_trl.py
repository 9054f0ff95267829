"""The TRL side of tools/bench_tdpo.py: ``DPOTrainer`` on a ``Qwen2VLForConditionalGeneration`` loaded from the
same weights, fed the same pairs pre-tokenised in TRL's own layout. TRL is not a project dependency."""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from ipl_jax import model as M
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.preference import tdpo as ipl


def median(xs):
    return float(np.median(np.asarray(xs)))


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


def make_trl(cfg: Qwen2VLConfig, params, workload, config: ipl.TDPOConfig, tmp: str):
    """A ``TrlVariant`` on the same weights and pairs, or a dict saying why TRL cannot run."""
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
    return TrlVariant(cfg, trainer, workload)


class TrlVariant:
    """DPOTrainer.training_step + optimizer.step per batch (after one untimed warm-up step); ``round()`` times
    each batch once, ``result()`` reports the median."""

    def __init__(self, cfg: Qwen2VLConfig, trainer, workload):
        import torch

        self.torch, self.trainer = torch, trainer
        self.rows = [trl_rows(cfg, groups, prs) + (len(prs),) for groups, prs in workload]
        with torch.no_grad():
            self.first_ref = trainer.compute_ref_log_probs(trainer.ref_model, self.rows[0][0])
        self._update(self.rows[0][0])  # warm-up (allocator, kernels), not timed
        self.times, self.losses = [], []

    def _update(self, inputs):
        loss = self.trainer.training_step(self.trainer.model, inputs)
        self.trainer.optimizer.step()
        self.trainer.optimizer.zero_grad(set_to_none=True)
        return float(loss)

    def round(self):
        for inputs, _, _, _ in self.rows:
            t = time.perf_counter()
            loss = self._update(inputs)
            self.times.append(time.perf_counter() - t)
            self.losses.append(loss)

    def result(self, our_ref=None) -> dict:
        """``our_ref``: (chosen, rejected) reference log-probs of the first batch's pairs from our packed forward;
        TRL's reference log-probs of the same pairs are compared with them."""
        inputs, real, padded, pairs = self.rows[0]
        step_s = median(self.times)
        parity = None
        if our_ref is not None:
            ref_c, ref_r = (x.numpy() for x in self.first_ref)
            parity = float(max(np.max(np.abs(ref_c - our_ref[0])), np.max(np.abs(ref_r - our_ref[1]))))
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
            "loss": self.losses[0],
            "step_times": self.times,
            "threads": self.torch.get_num_threads(),
            "max_abs_ref_logp_diff_vs_packed": parity,
        }
