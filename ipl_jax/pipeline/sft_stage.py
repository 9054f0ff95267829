"""Stage 4: warm-up SFT on the CoaT dialogues of the training steps plus the evolved Q&A. Each process builds
only its devices' rows (``SFTRows``); Orbax checkpoints make SFT resumable; the last ``sft.start_candidates``
are exported as candidates for the starting policy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from ipl_jax import distributed, storage
from ipl_jax.data.batching import collate, smallest_bucket
from ipl_jax.data.dialogue import annotated_steps, coat_example, qa_example
from ipl_jax.data.pipeline import iterator_state, make_dataset, make_iterator, restore_iterator
from ipl_jax.data.records import Step
from ipl_jax.envs.synthetic.reading import ReadingChat, pretrain_screens, reading_example
from ipl_jax.pipeline.model_stage import job_mesh, job_model_config, load_policy, write_policy_dir
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.settings import BucketSettings, Settings, SFTSettings
from ipl_jax.training.checkpoint import Checkpointer
from ipl_jax.training.loop import TrainLoop, place_state
from ipl_jax.training.lora import lora_of_rank
from ipl_jax.training.optimizer import OptimizerSettings, make_optimizer
from ipl_jax.training.sft import SFTStepConfig, sft_batch_axes, sft_batch_shardings, sft_model_batch, sft_step
from ipl_jax.training.state import VISION_REGEX, create_train_state, model_params
from ipl_jax.training.step import stack_microbatches

RECENT_LOSSES = 10  # SFT losses summarised as ``mean_loss_last_10``


@dataclasses.dataclass(frozen=True)
class SFTItem:
    """One training item: a step's CoaT chat (``qa`` None), a Q&A about that step's screen, or (``reading``)
    the reading chat of a pretraining screen."""

    step: Step
    qa: object = None
    reading: bool = False


def sft_items(
    train_steps: Sequence[Step], qas: Sequence, fallback: bool = False, screens: Sequence[Step] = ()
) -> tuple[list[SFTItem], int]:
    """(items, steps left out): CoaT items of the annotated training steps (all with ``fallback``), then one item
    per Q&A matched by ids to ``train_steps`` or ``screens``."""
    by_id = {(str(s.episode_id), int(s.step_id)): s for s in (*screens, *train_steps)}
    annotated, skipped = annotated_steps(train_steps, fallback)
    items = [SFTItem(s) for s in annotated]
    for qa in qas:
        step = by_id.get((str(qa.episode_id), int(qa.step_id)))
        if step is None:
            raise ValueError(f"Q&A about episode {qa.episode_id} step {qa.step_id}: no such training step")
        items.append(SFTItem(step, qa))
    return items, skipped


def make_example_fn(tokenizer, image_config, fallback: bool = False, reading=None):
    """item -> ``TrainingExample``; a step without CoaT raises ``MissingCoaTError`` unless ``fallback``;
    ``reading`` = (seed, ReadingChat) of reading items."""

    def example(item: SFTItem):
        if item.reading:
            return reading_example(item.step, *reading, tokenizer, image_config)
        if item.qa is None:
            return coat_example(item.step, tokenizer, image_config, fallback=fallback)
        return qa_example(
            tokenizer,
            image_config,
            item.step.load_image(),
            item.qa.question,
            item.qa.answer,
            name=f"qa {item.qa.episode_id}/{item.qa.step_id}/{item.qa.kind}",
        )

    return example


@dataclasses.dataclass(frozen=True)
class BatchShape:
    """An SFT batch: ``batch_size`` dialogues in micro-batches of ``micro`` with accumulated gradients."""

    batch_size: int
    micro: int

    def __post_init__(self):
        if self.micro < 1 or self.batch_size % self.micro:
            raise ValueError(f"SFT micro-batches of {self.micro} must divide the batch of {self.batch_size}")

    @property
    def n_micro(self) -> int:
        return self.batch_size // self.micro

    @staticmethod
    def of(sft: SFTSettings) -> BatchShape:
        return BatchShape(sft.batch_size, sft.micro)


def make_batch_builder(cfg, tokenizer, buckets: BucketSettings, shape: BatchShape):
    """(bucket, build): ``bucket(examples)`` is the token bucket (ValueError when none fits); ``build(parts, t,
    rows)`` makes SFT arrays at bucket ``t`` with a leading [A, ...] axis when A > 1, extra rows fully masked."""
    patches = buckets.patch_buckets(shape.micro)

    def bucket(examples) -> int:
        longest = max(len(e) for e in examples)
        name = next(e.name for e in examples if len(e) == longest)
        return smallest_bucket(longest, buckets.tokens, "token length of example " + name)

    def build(parts, t: int, rows: int):
        arrays = [
            sft_model_batch(
                cfg,
                collate(part, (t,), patches, tokenizer.ids.pad, batch_size=rows),
                image_patches=buckets.image_patches,  # each image encoded alone: linear, not quadratic, in the images
            )
            for part in parts
        ]
        return arrays[0] if len(arrays) == 1 else stack_microbatches(arrays)

    return bucket, build


def make_batch_fn(cfg, tokenizer, buckets: BucketSettings, shape: BatchShape):
    """examples (a whole batch, in order) -> the model's SFT arrays (``make_batch_builder``), on one host."""
    bucket, build = make_batch_builder(cfg, tokenizer, buckets, shape)
    micro, n_micro = shape.micro, shape.n_micro

    def batch_fn(examples):
        examples = list(examples)
        return build([examples[i * micro : (i + 1) * micro] for i in range(n_micro)], bucket(examples), micro)

    return batch_fn


@dataclasses.dataclass(frozen=True)
class LocalRows:
    """One process's share of an SFT batch: ``examples[a]`` micro-batch a's rows, their ``bucket``, ``tokens``
    and ``arrays``."""

    examples: list
    bucket: int
    tokens: int
    arrays: dict


class SFTRows:
    """Which rows of each SFT batch this process builds (``local_batch``, in loader threads), and ``assemble`` (a
    collective) making the global arrays at the agreed largest bucket.
    """

    def __init__(self, cfg, tokenizer, buckets: BucketSettings, shape: BatchShape, example_fn, template_item, mesh):
        self.bucket, self.build = make_batch_builder(cfg, tokenizer, buckets, shape)
        self.example_fn = example_fn
        self.micro, self.n_micro = shape.micro, shape.n_micro
        self.mesh = mesh
        self.rows = np.arange(self.micro)
        self.shardings = self.axes = None
        if mesh is not None:  # the shardings need only shapes: one example stands in for every row
            ex = example_fn(template_item)
            template = self.build([[ex]] * self.n_micro, self.bucket([ex]), self.micro)
            self.axes = sft_batch_axes(template, grad_accum=self.n_micro > 1)
            self.shardings = sft_batch_shardings(template, mesh, grad_accum=self.n_micro > 1)
            self.rows = distributed.held_rows(self.shardings, template, self.axes, self.micro)

    def local_batch(self, items) -> LocalRows:
        """grain batch_fn: the global batch's items -> this process's examples of every micro-batch."""
        items = list(items)
        parts = [[self.example_fn(items[a * self.micro + int(r)]) for r in self.rows] for a in range(self.n_micro)]
        flat = [e for part in parts for e in part]
        t = self.bucket(flat)
        return LocalRows(parts, t, sum(len(e) for e in flat), self.build(parts, t, len(self.rows)))

    def local_arrays(self, local: LocalRows, t: int) -> dict:
        """The local rows' arrays at the agreed token bucket ``t`` (>= their own)."""
        return local.arrays if t == local.bucket else self.build(local.examples, t, len(self.rows))

    def assemble(self, local: LocalRows):
        """(the batch: global arrays with ``shardings``, or host arrays without a mesh; its token count)."""
        agreed = distributed.allgather_ints([local.bucket, local.tokens])
        batch = self.local_arrays(local, int(agreed[:, 0].max()))
        if self.mesh is not None:
            batch = distributed.from_local_rows(batch, self.shardings, self.axes, self.rows, self.micro)
        return batch, int(agreed[:, 1].sum())


def sft_init_state(params, settings: Settings):
    """(TrainState, optimizer) of warm-up SFT: full weights or LoRA of rank ``sft.lora_rank`` (alpha = 2 x rank),
    ``sft.freeze_vision``; frozen weights in the storage dtype, trained ones and moments in float32."""
    sft = settings.sft
    optimizer = make_optimizer(sft.optimizer())
    lora = lora_of_rank(sft.lora_rank) if sft.lora_rank > 0 else None
    freeze = VISION_REGEX if sft.freeze_vision and lora is None else None
    state = create_train_state(
        params,
        optimizer,
        jax.random.PRNGKey(settings.seed),
        freeze_regex=freeze,
        lora=lora,
        frozen_dtype=settings.model.precision().frozen_dtype,
    )
    return state, optimizer


def sft_step_config(cfg, settings: Settings, optimizer: OptimizerSettings, shape: BatchShape) -> SFTStepConfig:
    """The SFT step of the job: the model in its compute dtype and attention, remat, micro-batches."""
    precision = settings.model.precision()
    return SFTStepConfig(
        model=job_model_config(cfg, settings.model),
        optimizer=optimizer,
        grad_accum_steps=shape.n_micro,
        remat=precision.remat,
        compute_dtype=precision.compute_dtype,
    )


def reading_items(settings: Settings) -> list[SFTItem]:
    """The reading chats warm-up SFT mixes in (``sft.reading_episodes`` episodes of the pretraining stream, the
    synthetic world's training split only)."""
    n = settings.sft.reading_episodes  # synthetic data only (``Settings`` checks)
    return [SFTItem(s, reading=True) for s in pretrain_screens(n, settings.seed, settings.world)]


def run_sft(
    settings: Settings, wd: Workdir, train_steps: Sequence[Step], qas: Sequence, screens: Sequence[Step] = ()
) -> dict:
    """Stage 4: train from ``WORKDIR/model/init``; checkpoints in ``WORKDIR/sft/checkpoints``, the last
    ``sft.start_candidates`` exported to ``WORKDIR/sft/candidates/step_<n>``."""
    sft = settings.sft
    if sft.steps == 0:  # start IPL from the given model as is (e.g. an instruction-tuned checkpoint)
        return {"steps": 0, "items": 0, "candidates": [str(wd.path("model", "init"))]}
    fallback = settings.data.coat_fallback
    items, skipped = sft_items(train_steps, qas, fallback, screens)
    wd.echo(
        f"  warm-up SFT: {len(train_steps) - skipped} of {len(train_steps)} training steps carry a CoaT annotation"
        + (f"; the {skipped} without one are left out (data.coat_fallback=false)" if skipped else "")
    )
    if skipped == len(train_steps):
        raise ValueError(
            f"warm-up SFT: none of the {len(train_steps)} training steps carries a CoaT annotation; pass "
            f"--config.data.coat_fallback=true to train on made-up thoughts, or give annotated data"
        )
    reading = reading_items(settings)
    if reading:
        wd.echo(f"  warm-up SFT: + the reading chats of {len(reading)} pretraining screens (sft.reading_episodes)")
    chat = (settings.seed, ReadingChat.of(settings.pretrain))
    fit = fit_dialogues(
        settings, wd, "sft", items + reading, lambda tok, image: make_example_fn(tok, image, fallback, chat)
    )
    counts = {
        "coat_items": len(train_steps) - skipped,
        "steps_without_coat": skipped,
        "qa_items": len(qas),
        "reading_items": len(reading),
    }
    return {"steps": fit.pop("steps"), "items": fit.pop("items"), **counts, **fit}


def fit_dialogues(settings: Settings, wd: Workdir, stage: str, items: Sequence, make_example) -> dict:
    """Train ``settings.sft.steps`` updates on ``items`` (``make_example(tokenizer, image_config)`` turns an item
    into a ``TrainingExample``) from ``WORKDIR/model/init``; resumable from ``WORKDIR/<stage>/checkpoints``; the
    last ``sft.start_candidates`` exported to ``WORKDIR/<stage>/candidates/step_<n>``."""
    sft = settings.sft
    label = "SFT" if stage == "sft" else stage
    mesh = job_mesh(settings.mesh)
    init = load_policy(wd.path("model", "init"), mesh)
    shape = BatchShape.of(sft)
    example_fn = make_example(init.tokenizer, init.image_config)
    rows = SFTRows(init.cfg, init.tokenizer, settings.buckets, shape, example_fn, items[0], mesh)
    # the same global order of items in every process; each builds the examples of its own rows only
    dataset = make_dataset(
        items, None, batch_size=sft.batch_size, seed=settings.seed, num_epochs=None, batch_fn=rows.local_batch
    )
    iterator = make_iterator(dataset, num_threads=settings.data.loader_threads, prefetch_buffer_size=4)

    state, optimizer = sft_init_state(init.params, settings)
    keep = sft.start_candidates
    ckpt = Checkpointer(wd.dir(stage) / "checkpoints", save_every=sft.checkpoint_every, keep=keep)
    state = place_state(state, optimizer, mesh)  # before a restore: Orbax reads each process's shards into place
    state, iterator, recent = resume(ckpt, state, iterator, wd, label)
    step_config = sft_step_config(init.cfg, settings, sft.optimizer(), shape)
    counter = {"tokens": 0.0}

    def counted_step(st, local: LocalRows):
        batch, tokens = rows.assemble(local)
        counter["tokens"] += float(tokens)
        return sft_step(st, batch, step_config, mesh=mesh)

    t0 = time.perf_counter()
    tokens0 = counter["tokens"]
    marks: list[tuple[float, float]] = []  # (seconds since t0, tokens so far) as each step's metrics arrive

    def on_metrics(step: int, m: dict) -> dict:
        recent.append(float(m["loss"]))
        del recent[:-RECENT_LOSSES]
        marks.append((time.perf_counter() - t0, counter["tokens"] - tokens0))
        rate = (counter["tokens"] - tokens0) / max(1e-9, time.perf_counter() - t0)
        record = {"stage": stage, "step": step, **m, "tokens_per_s": rate}
        wd.log_metrics(record)
        wd.tensorboard.sft(record)
        return {"loss": f"{m['loss']:.3f}", "tok_s": f"{rate:,.0f}"}

    metadata = {"stage": stage, "items": len(items), "batch_size": sft.batch_size}
    loop = TrainLoop(
        counted_step,
        kill_point="sft_step",
        desc=label,
        on_metrics=on_metrics,
        checkpointer=ckpt,
        data_state_fn=lambda: iterator_state(iterator),
        metadata_fn=lambda: {**metadata, "recent_losses": list(recent)},
    )
    state, _ = loop.run(state, iterator, start=int(state.step), num_steps=sft.steps)
    seconds = time.perf_counter() - t0
    candidates = export_candidates(wd, stage, ckpt, state, init, keep)
    return {
        "steps": sft.steps,
        "items": len(items),
        "final_loss": recent[-1] if recent else None,
        "mean_loss_last_10": float(np.mean(recent)) if recent else None,
        "train_seconds": round(seconds, 2),
        "tokens_per_s": round(counter["tokens"] / max(seconds, 1e-9), 1),
        **steady_rate(marks),
        "candidates": candidates,
    }


def resume(ckpt: Checkpointer, state, iterator, wd: Workdir, label: str):
    """(state, iterator, the last losses) from the latest checkpoint, as given when there is none; the losses are
    carried in the checkpoints so that a resumed run's summary is the same."""
    if ckpt.latest_step() is None:
        return state, iterator, []
    state, data_state, meta = ckpt.restore(state)
    if data_state:
        iterator = restore_iterator(iterator, data_state)
    wd.echo(f"  resuming {label} from its checkpoint at step {int(state.step)}")
    return state, iterator, [float(x) for x in meta.get("recent_losses", [])]


def export_candidates(wd: Workdir, stage: str, ckpt: Checkpointer, state, init, keep: int) -> list[str]:
    """The last ``keep`` checkpoints as policy directories ``WORKDIR/<stage>/candidates/step_<n>``."""
    cand_root = wd.dir(stage, "candidates")
    candidates = []
    for step in ckpt.all_steps()[-keep:]:
        restored, _, _ = ckpt.restore(state, step=step)
        params = model_params(restored.params, restored.frozen)
        out = write_policy_dir(
            cand_root / f"step_{step:06d}", params, init.cfg, wd.path("model", "init"), init.image_config
        )
        candidates.append(str(out))
    ckpt.close()
    return candidates


def steady_rate(marks: list[tuple[float, float]]) -> dict:
    """``tokens``, ``first_step_seconds`` and ``tokens_per_s_steady`` (None with one step) from per-step marks."""
    if not marks:
        return {"tokens": 0.0, "first_step_seconds": None, "tokens_per_s_steady": None}
    (t1, n1), (tn, nn) = marks[0], marks[-1]
    steady = round((nn - n1) / (tn - t1), 1) if len(marks) > 1 and tn > t1 else None
    return {"tokens": nn, "first_step_seconds": round(t1, 3), "tokens_per_s_steady": steady}


def candidate_policies(summary: dict) -> list[Path]:
    """The candidates' policy directories (local paths or URIs, ``storage.as_path``)."""
    return [storage.as_path(p) for p in summary["candidates"]]
