"""Stage 7: one IPL round (docs/method.md §6, §7), from the policy directory of the round before.

A round is ``preference.round.ipl_round`` with the pipeline's pieces plugged in as its ``RoundStages``: ``sample``
draws CoaT-trees on the round's training steps with the round's starting policy, ``score`` gives leaf rewards and
backed-up values (``eval.trees``), ``golden_update`` is the ``continued_sft`` control's supervised training. The
round's configs (``RoundConfig``, ``TDPOConfig``) are made here from the job's ``ipl`` settings. The new policy
is written as ``WORKDIR/rounds/<r>/policy`` and evaluated on dev; with ``ipl.method`` = grpo / ppo / gigppo the
round is ``pipeline.rl_round``'s. The loop over rounds is ``pipeline.run.Job.rounds``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.tree import num_leaves
from ipl_jax.data.dialogue import annotated_steps
from ipl_jax.data.records import Episode, Step
from ipl_jax.eval.seed_selection import sample_steps
from ipl_jax.eval.trees import (
    iter_tree_batches,
    reward_config,
    round_scores,
    sampled_trees,
    sampler_config,
    score_batch,
)
from ipl_jax.pipeline.data_stage import oracle_steps, steps_of
from ipl_jax.pipeline.model_stage import (
    Policy,
    inference_policy,
    job_mesh,
    job_model_config,
    load_policy,
    write_policy_dir,
)
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.rl_round import run_rl_round
from ipl_jax.pipeline.round_diagnostics import RoundDiagnostics
from ipl_jax.pipeline.round_eval import dev_accuracy
from ipl_jax.pipeline.sft_stage import BatchShape, SFTItem, SFTRows, make_example_fn
from ipl_jax.pipeline.workdir import Workdir, write_json
from ipl_jax.preference.losses import DPOConfig
from ipl_jax.preference.packed_batch import PackingConfig
from ipl_jax.preference.pairs import PairConfig
from ipl_jax.preference.round import RoundConfig, RoundStages, ipl_round
from ipl_jax.preference.tdpo import IPL_OPTIMIZER, TDPOConfig, init_state, round_schedule, summarize_steps
from ipl_jax.progress import progress
from ipl_jax.rl.job import round_budget
from ipl_jax.sampling.tree_records import tree_record, turn_texts
from ipl_jax.settings import GOLDEN_METHODS, RL_METHODS, Settings
from ipl_jax.training.lora import LoraConfig
from ipl_jax.training.optimizer import OptimizerSettings
from ipl_jax.training.sft import SFTStepConfig, sft_step
from ipl_jax.training.state import VISION_REGEX, model_params, state_shardings
from ipl_jax.viz.viewer import write_html

# ------------------------------------------------------------------------------------------ the round's configs


def ipl_optimizer(settings: Settings, round_index: int = 1) -> OptimizerSettings:
    """A round's optimizer: the ``ipl`` section's learning rate (``later_learning_rate`` from round 2 when set),
    schedule and warm-up, SFT's gradient clipping."""
    ipl = settings.ipl
    return dataclasses.replace(
        IPL_OPTIMIZER,
        learning_rate=ipl.lr(round_index),
        schedule=ipl.schedule,
        warmup_steps=ipl.warmup_steps,
        grad_clip_norm=settings.sft.grad_clip,
    )


def tdpo_config(settings: Settings, cfg, round_index: int = 1) -> TDPOConfig:
    """A round's T-DPO step: the model in the job's compute dtype, the loss of ``ipl``, its optimizer."""
    ipl, precision = settings.ipl, settings.model.precision()
    return TDPOConfig(
        model=job_model_config(cfg, settings.model),
        remat=precision.remat,
        compute_dtype=precision.compute_dtype,
        reference_dtype=precision.storage,
        dpo=DPOConfig(beta=ipl.beta, sft_weight=ipl.sft_weight, kind=ipl.loss_kind, sft_norm=ipl.sft_norm),
        objective="positive_sft" if ipl.method == "no_negatives" else "tdpo",
        optimizer_settings=ipl_optimizer(settings, round_index),
    )


def round_config(settings: Settings, cfg, pad_id: int, round_index: int = 1) -> RoundConfig:
    """The ``preference.round.RoundConfig`` of a round: pairs, selection and packing as ``ipl`` says."""
    ipl = settings.ipl
    packing = PackingConfig(
        rows=ipl.batch_size,
        max_continuations=max(settings.sampler.branching) + 1,
        max_pairs=ipl.max_pairs_per_batch,
        text_buckets=ipl.text_buckets,
        patch_buckets=settings.buckets.patch_buckets(ipl.batch_size),
        pad_id=int(pad_id),
    )
    pairs = PairConfig(
        max_beta_pairs_per_tree_turn=ipl.max_pairs_per_tree,
        max_gamma_pairs_per_tree_turn=0 if ipl.gamma_pairs == "none" else ipl.gamma_cap,
        gamma_action_pairs=ipl.gamma_pairs in ("paper", "consistent"),
        gamma_grounding_pairs=ipl.gamma_pairs != "none",
        turns=ipl.pair_turns,
    )
    return RoundConfig(
        tdpo=tdpo_config(settings, cfg, round_index),
        packing=packing,
        pairs=pairs,
        pair_mode="naive" if ipl.method == "naive_dpo" else "tdpo",
        dedup=ipl.dedup,
        type_balance=ipl.type_balance,
        mix_trees=ipl.mix_trees,
        train_on="golden" if ipl.method in GOLDEN_METHODS else "pairs",
        gamma_consistent_only=ipl.gamma_pairs == "consistent",
    )


def round_steps(train_steps: Sequence[Step], settings: Settings, round_index: int) -> list[Step]:
    """The training steps whose trees are sampled in a round: a seeded sample per round (all when
    ``steps_per_round`` is 0 or exceeds the data)."""
    n = settings.ipl.steps_in_round(len(train_steps))
    return sample_steps(train_steps, n, settings.seed * 1000 + round_index)


# ------------------------------------------------------------------------------------------------ one round


def golden_update_fn(settings: Settings, policy: Policy, steps: Sequence[Step], rcfg: RoundConfig):
    """``RoundStages.golden_update`` of the ``continued_sft`` / ``sft_oracle`` variants: ``n`` supervised updates
    with the round's optimizer on the golden CoaT of ``steps``, ``ipl.batch_size`` dialogues per update, epochs in
    seeded orders. A step without CoaT is refused here, before the round samples anything (unless
    ``data.coat_fallback``). Batches are built as warm-up SFT's (``sft_stage.SFTRows``): under the policy's mesh
    each process builds only its devices' rows and the step runs with the state and batch shardings of warm-up
    SFT."""
    fallback = settings.data.coat_fallback
    _, missing = annotated_steps(steps, fallback)
    if missing or not steps:
        raise UsageError(
            f"config.ipl.method={settings.ipl.method!r}: {missing} of the {len(steps)} steps it trains on carry no "
            f"CoaT annotation; supervised training never makes up thoughts (data.coat_fallback=false)"
        )
    bs = min(settings.ipl.batch_size, len(steps))
    micro = min(bs, settings.sft.micro_batch_size or bs)
    while bs % micro:
        micro -= 1
    shape = BatchShape(bs, micro)
    example = make_example_fn(policy.tokenizer, policy.image_config, fallback)
    mesh = policy.mesh
    rows = SFTRows(policy.cfg, policy.tokenizer, settings.buckets, shape, example, SFTItem(steps[0]), mesh)

    def update(state, n_updates: int, rng):
        tdpo = round_schedule(rcfg.tdpo, n_updates)
        if mesh is not None:
            state = distributed.put(state, state_shardings(state, tdpo.optimizer(), mesh))
        else:  # committed like the step's outputs: one program for every update
            state = jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
        step_config = SFTStepConfig(
            model=tdpo.model,
            optimizer=tdpo.optimizer_settings,
            grad_accum_steps=shape.n_micro,
            remat=tdpo.remat,
            compute_dtype=tdpo.compute_dtype,
        )
        seed = [int(x) for x in np.asarray(distributed.to_host(rng), np.uint32).reshape(-1)]
        order_rng = np.random.default_rng(seed)
        order: list[int] = []
        per_step = []
        for _ in progress(range(n_updates), desc="continued SFT", unit="step"):
            if len(order) < bs:
                order.extend(order_rng.permutation(len(steps)).tolist())
            chosen, order = order[:bs], order[bs:]
            batch, _ = rows.assemble(rows.local_batch([SFTItem(steps[i]) for i in chosen]))
            state, m = sft_step(state, batch, step_config, mesh=mesh)
            per_step.append({k: float(v) for k, v in distributed.to_host(m).items()})
        for m in per_step:
            m.setdefault("pairs", float(bs))  # weight for the round means: dialogues per update
        out = summarize_steps(per_step)
        out["per_step"] = per_step
        return state, out

    return update


def golden_steps(
    settings: Settings, wd: Workdir, steps: Sequence[Step], annotated: Sequence[Step] | None
) -> list[Step]:
    """What a supervised variant trains on: ``continued_sft`` the golden CoaT of the round's steps, or, when they
    are action logs (scarce annotations), of the annotated training steps (no new labels); ``sft_oracle`` the
    annotations of the round's action-only steps, read back from the dataset (``data_stage.oracle_steps``)."""
    if settings.ipl.method == "sft_oracle":
        return oracle_steps(settings.data, wd, steps)
    return list(annotated) if settings.data.scarce and annotated is not None else list(steps)


def run_round(
    settings: Settings,
    wd: Workdir,
    round_index: int,
    start: Path,
    train_steps: Sequence[Step],
    dev_episodes: Sequence[Episode],
    annotated: Sequence[Step] | None = None,
) -> dict:
    """One IPL round from the policy directory ``start`` on trees sampled from ``train_steps`` (the action-only
    steps of a scarce-annotation job); writes ``rounds/<r>/policy``, ``trees.jsonl`` (a few sampled trees for the
    viewer) and ``round.json``. Returns the round record of ``ipl_round`` plus ``dev`` (the new policy's dev
    accuracy) and ``policy``. ``annotated``: warm-up SFT's steps, what ``continued_sft`` trains on when the round's
    steps carry no CoaT (default: ``train_steps``)."""
    ipl = settings.ipl
    if ipl.method in RL_METHODS:
        return run_rl_round(settings, wd, round_index, start, train_steps, dev_episodes)
    policy = load_policy(start, job_mesh(settings.mesh))
    steps = round_steps(train_steps, settings, round_index)
    rcfg = round_config(settings, policy.cfg, policy.tokenizer.ids.pad, round_index)
    sconfig = sampler_config(policy.tokenizer, settings.sampler, settings.buckets, settings.eval.batch_size)
    reward = reward_config(settings.reward, settings.data)
    discount = settings.reward.discount
    out_dir = wd.dir("rounds", str(round_index))
    diagnostics = None
    if ipl.diagnostics:
        diagnostics = RoundDiagnostics(settings, policy, steps, steps_of(dev_episodes), sconfig, round_index)
    kept_trees: list[tuple[dict, Step]] = []
    pending: dict[int, tuple] = {}
    n_view = settings.export.viewer_steps

    def sample(params, _n, rng):
        current = inference_policy(policy, settings.model, params)  # storage-dtype weights, compute-dtype cache
        seed = int(jax.random.randint(rng, (), 0, 2**31 - 1))
        bs = settings.sampler.batch_size
        batches = iter_tree_batches(current, steps, sconfig, seed, bs)
        for batch in progress(batches, total=-(-len(steps) // bs), desc=f"round {round_index} trees", unit="batch"):
            sampled = sampled_trees(batch, policy.tokenizer)
            pending[id(sampled)] = (batch, turn_texts(batch.tree, policy.tokenizer))
            yield sampled

    def score(sampled):
        batch, texts = pending.pop(id(sampled))
        actions, scores = score_batch(batch, texts, reward, discount)
        for row, step in enumerate(batch.steps):
            if len(kept_trees) < n_view and bool(batch.tree.step_valid[row]):
                kept_trees.append((tree_record(batch.tree, row, texts, actions, scores, step, discount), step))
        return round_scores(batch, texts, actions, scores)

    golden = None
    if rcfg.train_on == "golden":
        golden = golden_update_fn(settings, policy, golden_steps(settings, wd, steps, annotated), rcfg)
    rng = jax.random.PRNGKey(settings.seed * 7919 + round_index)
    frozen = settings.model.precision().frozen_dtype  # frozen base / vision tower; trained weights stay fp32
    if ipl.lora_rank > 0:
        lora = LoraConfig(rank=ipl.lora_rank, alpha=float(2 * ipl.lora_rank))
        state = init_state(policy.params, rcfg.tdpo, rng, lora=lora, frozen_dtype=frozen)
    else:
        vision = VISION_REGEX if ipl.freeze_vision else None
        state = init_state(policy.params, rcfg.tdpo, rng, freeze_regex=vision, frozen_dtype=frozen)
    stages = RoundStages(
        sample=sample, score=score, golden_update=golden, probe=None if diagnostics is None else diagnostics.probe()
    )
    state, record = ipl_round(state, rcfg, stages, round_index, rng, mesh=policy.mesh)
    params = model_params(state.params, state.frozen)
    del state
    # sampled completions (tree leaves) of the round: the budget the RL methods are given (rl/job.py)
    record["samples"] = len(steps) * num_leaves(settings.sampler.branching)
    record["budget"] = round_budget(ipl, settings.sampler.branching, len(train_steps))
    t0 = time.perf_counter()
    record["dev"] = dev_accuracy(inference_policy(policy, settings.model, params), dev_episodes, settings)
    record["seconds"]["evaluate"] = time.perf_counter() - t0
    wd.echo(
        f"  round {round_index}: {record['pairs']} pairs, classes α {record['classes']['alpha']:.2f} "
        f"β {record['classes']['beta']:.2f} γ {record['classes']['gamma']:.2f}, "
        f"loss {record['train'].get('loss', float('nan')):.4f}, dev step accuracy "
        f"{record['dev']['step_accuracy']:.4f}, {record['seconds']['total']:.1f}s"
    )
    write_policy_dir(out_dir / "policy", params, policy.cfg, start, policy.image_config)
    if wd.main:
        write_trees(out_dir, kept_trees, f"IPL round {round_index}: trees sampled with the round's starting policy")
        write_json(out_dir / "round.json", record)
    distributed.barrier(f"round {round_index} written")
    record["policy"] = str(out_dir / "policy")
    return record


def write_trees(out_dir: Path, kept: Sequence[tuple[dict, Step]], title: str) -> None:
    """``trees.jsonl`` (one ``tree_record`` per line) and ``trees.html`` (the viewer, screenshots inline)."""
    with open(out_dir / "trees.jsonl", "w", encoding="utf-8") as f:
        for record, _ in kept:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_html(out_dir / "trees.html", [r for r, _ in kept], [s.load_image() for _, s in kept], title=title)
