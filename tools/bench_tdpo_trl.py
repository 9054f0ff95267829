"""The TRL side of tools.bench_tdpo: ``DPOTrainer`` on a ``Qwen2VLForConditionalGeneration`` loaded from the
same weights, fed the same pairs pre-tokenised in TRL's own layout. TRL comes with the test extra, not with the
package."""

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


def _import_error():
    """None when TRL and its dependencies import, else the reason."""
    try:
        import datasets  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except Exception as e:
        return f"cannot import TRL and its dependencies: {type(e).__name__}: {e}"
    return None


def _trainer(policy_dir: str, ref_dir: str, beta: float, learning_rate: float, tmp: str):
    """A ``DPOTrainer`` (sigmoid loss, no label smoothing, no SFT term) on the checkpoints in ``policy_dir`` and
    ``ref_dir``, ready for ``training_step`` on batches from ``trl_rows``."""
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast, Qwen2VLForConditionalGeneration
    from trl import DPOConfig, DPOTrainer

    load = lambda d: Qwen2VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    model, ref_model = load(policy_dir), load(ref_dir)
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
        learning_rate=learning_rate,
        beta=beta,
        loss_type=["sigmoid"],
        label_smoothing=0.0,
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
    return trainer


def make_trl(cfg: Qwen2VLConfig, params, workload, config: ipl.TDPOConfig, tmp: str):
    """A ``TrlVariant`` on the same weights and pairs, or a dict saying why TRL cannot run."""
    reason = _import_error()
    if reason:
        return {"variant": "trl", "skipped": reason}
    model_dir = os.path.join(tmp, "weights")
    M.save_params(jax.device_get(params), cfg, model_dir)
    trainer = _trainer(model_dir, model_dir, config.dpo.beta, 1e-6, tmp)
    return TrlVariant(cfg, trainer, workload)


def trl_agreement_side(cfg: Qwen2VLConfig, params, ref_params, groups, pairs, beta: float, tmp: str) -> dict:
    """What TRL computes for these pairs with policy ``params`` and reference ``ref_params`` (both saved as
    Hugging Face checkpoints and loaded into ``Qwen2VLForConditionalGeneration`` in float32).

    Per pair (one ``compute_loss`` on that pair's two rows): ``loss`` f64[P] and the implicit rewards
    ``chosen_reward`` / ``rejected_reward`` (β · log-ratio, as TRL logs them). On all pairs in one batch (the
    rows right-padded, as TRL's collator lays them out): ``batch_loss`` from ``training_step`` and ``grads``, the
    parameters' gradient after its backward pass, converted to our parameter tree (via a safetensors file read
    by ``model.load_params``). A dict with ``skipped`` when TRL cannot be imported.
    """
    reason = _import_error()
    if reason:
        return {"skipped": reason}
    import torch
    from safetensors.numpy import save_file

    torch.set_float32_matmul_precision("highest")
    policy_dir, ref_dir = os.path.join(tmp, "policy"), os.path.join(tmp, "reference")
    M.save_params(jax.device_get(params), cfg, policy_dir)
    M.save_params(jax.device_get(ref_params), cfg, ref_dir)
    trainer = _trainer(policy_dir, ref_dir, beta, 0.0, tmp)
    model, logged = trainer.model, trainer._metrics["train"]  # TRL's own per-batch metric lists
    loss, chosen, rejected = [], [], []
    with torch.no_grad():
        for p in pairs:
            inputs, _, _ = trl_rows(cfg, groups, [p])
            loss.append(float(trainer.compute_loss(model, inputs)))
            chosen.append(logged["rewards/chosen"][-1])
            rejected.append(logged["rewards/rejected"][-1])
    model.zero_grad(set_to_none=True)
    inputs, _, _ = trl_rows(cfg, groups, pairs)
    batch_loss = float(trainer.training_step(model, inputs))
    grad_dir = os.path.join(tmp, "trl_grads")
    os.makedirs(grad_dir)
    tensors = {
        name: (np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.detach().numpy().copy())
        for name, p in model.named_parameters()
    }
    save_file(tensors, os.path.join(grad_dir, "model.safetensors"))
    grads, _ = M.load_params(grad_dir, cfg=cfg)
    return {
        "loss": np.asarray(loss, np.float64),
        "chosen_reward": np.asarray(chosen, np.float64),
        "rejected_reward": np.asarray(rejected, np.float64),
        "batch_loss": batch_loss,
        "grads": grads,
    }


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
