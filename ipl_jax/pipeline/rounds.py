"""Stage 7: one IPL round (a policy's evaluation is ``pipeline.round_eval``, the typed ``ipl`` section
``pipeline.round_settings``; both names stay importable from here).

A round is ``preference.round.ipl_round`` with the pipeline's pieces plugged in as its ``RoundStages``: ``sample``
draws CoaT-trees on the round's training steps with the round's starting policy, ``score`` gives leaf rewards and
backed-up values (``eval.trees``), ``golden_update`` is the ``continued_sft`` control's supervised training.
The round's policy is written as ``WORKDIR/rounds/<r>/policy`` and evaluated on dev; the loop over rounds, with
early stopping and resuming, is ``pipeline.run.Job.rounds``. The job's ``ipl`` section is read once into a
typed ``IPLSettings`` (``round_settings.ipl_settings``). With ``ipl.method`` = grpo / ppo / gigppo, ``run_round``
hands the round to ``pipeline.rl_round`` (same inputs, same record keys). A round's evaluation adds the
live-world episodes of ``eval.online_episodes`` (``round_eval.evaluate_online``).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from ipl_jax import distributed
from ipl_jax.data.records import Episode, Step
from ipl_jax.pipeline.model_stage import (
    Policy,
    inference_policy,
    job_frozen_dtype,
    job_mesh,
    load_policy,
    write_policy_dir,
)
from ipl_jax.pipeline.round_eval import (  # noqa: F401  (re-exported: the job's evaluation helpers)
    dev_accuracy,
    eval_config,
    evaluate_online,
    evaluate_policy_splits,
    evaluate_splits,
    limit_episodes,
)
from ipl_jax.pipeline.round_settings import (  # noqa: F401  (re-exported: the typed ipl section)
    GAMMA_MODES,
    METHODS,
    RL_METHODS,
    IPLSettings,
    ipl_optimizer,
    ipl_settings,
    round_config,
    tdpo_config,
)
from ipl_jax.pipeline.workdir import Workdir, write_json
from ipl_jax.progress import progress


def round_steps(train_steps: Sequence[Step], config: ml_collections.ConfigDict, round_index: int) -> list[Step]:
    """The training steps whose trees are sampled in a round: a seeded sample per round (all when
    ``steps_per_round`` is 0 or exceeds the data)."""
    from ipl_jax.eval.seed_selection import sample_steps

    s = ipl_settings(config)
    n = s.steps_per_round
    if s.round_fraction > 0:
        n = max(1, round(s.round_fraction * len(train_steps)))
    return sample_steps(train_steps, n, int(config.seed) * 1000 + round_index)


# ------------------------------------------------------------------------------------------------ one round


def golden_update_fn(config: ml_collections.ConfigDict, policy: Policy, steps: Sequence[Step], rcfg):
    """``RoundStages.golden_update`` of the ``continued_sft`` / ``sft_oracle`` variants: ``n`` supervised updates
    with the round's optimizer on the golden CoaT of ``steps``, ``ipl.batch_size`` dialogues per update, epochs in
    seeded orders. A step without CoaT is refused here, before the round samples anything (unless
    ``data.coat_fallback``). Batches are built as warm-up SFT's (``sft_stage.SFTRows``): under the policy's mesh
    each process builds only its devices' rows and the step runs with the state and batch shardings of warm-up
    SFT."""
    from ipl_jax.data.dialogue import annotated_steps
    from ipl_jax.pipeline.sft_stage import SFTItem, SFTRows, coat_fallback, make_example_fn, sft_state_shardings
    from ipl_jax.pipeline.validate import UsageError
    from ipl_jax.preference.tdpo import round_schedule, summarize_steps
    from ipl_jax.training.sft import make_qwen2vl_sft_step

    fallback = coat_fallback(config)
    _, missing = annotated_steps(steps, fallback)
    if missing or not steps:
        raise UsageError(
            f"config.ipl.method={config.ipl.method!r}: {missing} of the {len(steps)} steps it trains on carry no "
            f"CoaT annotation; supervised training never makes up thoughts (data.coat_fallback=false)"
        )
    bs = min(int(config.ipl.batch_size), len(steps))
    sft_like = ml_collections.ConfigDict(config.to_dict())
    sft_like.sft.batch_size, sft_like.sft.micro_batch_size = bs, min(bs, int(config.sft.micro_batch_size) or bs)
    while bs % sft_like.sft.micro_batch_size:
        sft_like.sft.micro_batch_size -= 1
    example = make_example_fn(policy.tokenizer, policy.image_config, fallback)
    mesh = policy.mesh
    rows = SFTRows(policy.cfg, policy.tokenizer, sft_like, example, SFTItem(steps[0]), mesh)
    n_micro = bs // int(sft_like.sft.micro_batch_size)

    def update(state, n_updates: int, rng):
        tdpo = round_schedule(rcfg.tdpo, n_updates)
        if mesh is None:  # committed like the step's outputs: one program for every update
            state = jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
            step_fn = _golden_step(tdpo, n_micro)
        else:
            optimizer = tdpo.optimizer()
            state_sh = sft_state_shardings(state, optimizer, mesh)
            state = distributed.put(state, state_sh)
            step_fn = make_qwen2vl_sft_step(
                tdpo.model,
                optimizer,
                tdpo.schedule_fn(),
                grad_accum_steps=n_micro,
                remat=tdpo.remat,
                compute_dtype=tdpo.compute_dtype,
                mesh=mesh,
                state_shardings=state_sh,
                batch_shardings=rows.shardings,
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
            state, m = step_fn(state, batch)
            per_step.append({k: float(v) for k, v in distributed.to_host(m).items()})
        for m in per_step:
            m.setdefault("pairs", float(bs))  # weight for the round means: dialogues per update
        out = summarize_steps(per_step)
        out["per_step"] = per_step
        return state, out

    return update


@functools.lru_cache(maxsize=8)
def _golden_step(tdpo, n_micro: int):
    """The supervised step of the golden updates on one device, made once per settings (``TDPOConfig`` is
    hashable): the rounds of a job, and the variants of an ablation, with the same settings compile it once."""
    from ipl_jax.training.sft import make_qwen2vl_sft_step

    return make_qwen2vl_sft_step(
        tdpo.model,
        tdpo.optimizer(),
        tdpo.schedule_fn(),
        grad_accum_steps=n_micro,
        remat=tdpo.remat,
        compute_dtype=tdpo.compute_dtype,
    )


def golden_steps(
    config: ml_collections.ConfigDict, wd: Workdir, method: str, steps: Sequence[Step], annotated: Sequence[Step] | None
) -> list[Step]:
    """What a supervised variant trains on: ``continued_sft`` the golden CoaT of the round's steps, or, when they
    are action logs (scarce annotations), of the annotated training steps (no new labels); ``sft_oracle`` the
    annotations of the round's action-only steps, read back from the dataset (``data_stage.oracle_steps``)."""
    from ipl_jax.pipeline.data_stage import oracle_steps, scarce_counts

    scarce = scarce_counts(config)[1] > 0
    if method == "sft_oracle":
        return oracle_steps(config, wd, steps)
    return list(annotated) if scarce and annotated is not None else list(steps)


def run_round(
    config: ml_collections.ConfigDict,
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
    from ipl_jax.coat.tree import num_leaves
    from ipl_jax.eval.trees import iter_tree_batches, round_scores, sampled_trees, sampler_config, score_batch
    from ipl_jax.preference.round import RoundStages, ipl_round
    from ipl_jax.preference.tdpo import init_state
    from ipl_jax.rl.job import round_budget
    from ipl_jax.sampling.tree_records import tree_record, turn_texts
    from ipl_jax.training.state import VISION_REGEX, model_params

    s = ipl_settings(config)
    if s.method in RL_METHODS:
        from ipl_jax.pipeline.rl_round import run_rl_round

        return run_rl_round(config, wd, round_index, start, train_steps, dev_episodes)
    policy = load_policy(start, job_mesh(config))
    steps = round_steps(train_steps, config, round_index)
    rcfg = round_config(config, policy.cfg, policy.tokenizer, round_index)
    sconfig = sampler_config(config, policy.tokenizer)
    out_dir = wd.dir("rounds", str(round_index))
    diagnostics = None
    if s.diagnostics:
        from ipl_jax.pipeline.data_stage import steps_of
        from ipl_jax.pipeline.round_diagnostics import RoundDiagnostics

        diagnostics = RoundDiagnostics(config, policy, steps, steps_of(dev_episodes), sconfig, round_index)
    kept_trees: list[tuple[dict, Step]] = []
    pending: dict[int, tuple] = {}
    n_view = int(config.export.viewer_steps)

    def sample(params, _n, rng):
        current = inference_policy(policy, config, params)  # storage-dtype weights, KV cache in the compute dtype
        seed = int(jax.random.randint(rng, (), 0, 2**31 - 1))
        bs = int(config.sampler.batch_size)
        batches = iter_tree_batches(current, steps, sconfig, seed, bs)
        for batch in progress(batches, total=-(-len(steps) // bs), desc=f"round {round_index} trees", unit="batch"):
            sampled = sampled_trees(batch, policy.tokenizer)
            pending[id(sampled)] = (batch, turn_texts(batch.tree, policy.tokenizer))
            yield sampled

    def score(sampled):
        batch, texts = pending.pop(id(sampled))
        actions, scores = score_batch(batch, texts, config)
        if diagnostics is not None:
            diagnostics.record(batch, texts, actions, scores)
        for row, step in enumerate(batch.steps):
            if len(kept_trees) < n_view and bool(batch.tree.step_valid[row]):
                kept_trees.append(
                    (tree_record(batch.tree, row, texts, actions, scores, step, float(config.reward.discount)), step)
                )
        return round_scores(batch, texts, actions, scores)

    golden = None
    if rcfg.train_on == "golden":
        golden = golden_update_fn(config, policy, golden_steps(config, wd, s.method, steps, annotated), rcfg)
    rng = jax.random.PRNGKey(int(config.seed) * 7919 + round_index)
    frozen = job_frozen_dtype(config)  # frozen base / vision tower; trained weights stay fp32
    if s.lora_rank > 0:
        from ipl_jax.training.lora import LoraConfig

        lora = LoraConfig(rank=s.lora_rank, alpha=float(2 * s.lora_rank))
        state = init_state(policy.params, rcfg.tdpo, rng, lora=lora, frozen_dtype=frozen)
    else:
        vision = VISION_REGEX if s.freeze_vision else None
        state = init_state(policy.params, rcfg.tdpo, rng, freeze_regex=vision, frozen_dtype=frozen)
    stages = RoundStages(
        sample=sample, score=score, golden_update=golden, probe=None if diagnostics is None else diagnostics.probe()
    )
    state, record = ipl_round(state, rcfg, stages, round_index, rng, mesh=policy.mesh)
    params = model_params(state.params, state.frozen)
    del state
    # sampled completions (tree leaves) of the round: the budget the RL methods are given (rl/job.py)
    record["samples"] = len(steps) * num_leaves(tuple(int(b) for b in config.sampler.branching))
    record["budget"] = round_budget(config, len(train_steps))
    t0 = time.perf_counter()
    record["dev"] = dev_accuracy(inference_policy(policy, config, params), dev_episodes, config)
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
    from ipl_jax.viz.viewer import write_html

    with open(out_dir / "trees.jsonl", "w", encoding="utf-8") as f:
        for record, _ in kept:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_html(out_dir / "trees.html", [r for r, _ in kept], [s.load_image() for _, s in kept], title=title)
