"""Stages 6 and 7: evaluation of a policy on the test splits, and one IPL round.

A round is ``preference.round.ipl_round`` with the pipeline's pieces plugged in as its ``RoundStages``: ``sample``
draws CoaT-trees on the round's training steps with the round's starting policy, ``score`` gives leaf rewards and
backed-up values (``eval.trees``), ``golden_update`` is the ``continued_sft`` control's supervised training.
The round's policy is written as ``WORKDIR/rounds/<r>/policy`` and evaluated on dev; the loop over rounds, with
early stopping and resuming, is ``pipeline.run.Job.rounds``. The job's ``ipl`` section is read once into a typed
``IPLSettings`` (``ipl_settings``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from ipl_jax.data.records import Episode, Step
from ipl_jax.pipeline.model_stage import (
    Policy,
    inference_policy,
    job_mesh,
    job_model_config,
    job_precision,
    job_remat,
    load_policy,
    write_policy_dir,
)
from ipl_jax.pipeline.workdir import Workdir, write_json

METHODS = ("tdpo", "naive_dpo", "no_negatives", "continued_sft")
GAMMA_MODES = ("paper", "consistent", "grounding", "none")


# ------------------------------------------------------------------------------------------------ evaluation


def limit_episodes(episodes: Sequence[Episode], max_steps: int) -> list[Episode]:
    """Whole episodes, in order, until ``max_steps`` steps are reached (0: all)."""
    if max_steps <= 0:
        return list(episodes)
    out, n = [], 0
    for e in episodes:
        if n >= max_steps:
            break
        out.append(e)
        n += len(e.steps)
    return out


def eval_config(policy: Policy, config: ml_collections.ConfigDict, blank_screens: bool = False):
    """``evaluate.EvalConfig`` of the job: its sampler settings (made greedy), the policy's image settings."""
    from ipl_jax.eval.evaluate import EvalConfig
    from ipl_jax.eval.trees import sampler_config
    from ipl_jax.pipeline.data_stage import scoring_format

    return EvalConfig(
        sampler=sampler_config(config, policy.tokenizer),
        image_config=policy.image_config,
        batch_size=int(config.eval.batch_size),
        fmt=scoring_format(config),
        seed=int(config.seed),
        blank_screens=blank_screens,
    )


def evaluate_splits(
    policy: Policy,
    splits: dict[str, list[Episode]],
    names: Sequence[str],
    config: ml_collections.ConfigDict,
    out_dir: Path,
    echo=print,
    blank_screens: bool = False,
) -> dict:
    """Greedy CoaT decoding + the Step.Acc table (the ``ipl-jax score`` JSON) of each split in ``names``
    (``evaluate.evaluate_policy``); predictions go to ``out_dir/<split>.predictions.jsonl`` (``<split>.blank.
    predictions.jsonl`` with ``blank_screens``: every screenshot replaced by a grey image)."""
    from ipl_jax.eval.evaluate import evaluate_policy

    out_dir.mkdir(parents=True, exist_ok=True)
    ec = eval_config(policy, config, blank_screens)
    tables = {}
    for name in names:
        t0 = time.perf_counter()
        episodes = limit_episodes(splits[name], int(config.eval.max_steps))
        records, table = evaluate_policy(policy.params, policy.cfg, policy.tokenizer, episodes, ec, policy.mesh)
        suffix = ".blank" if blank_screens else ""
        with open(out_dir / f"{name}{suffix}.predictions.jsonl", "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        tables[name] = table
        echo(
            f"  {name}{' (blank screens)' if blank_screens else ''}: step accuracy "
            f"{100 * (table['step_acc'] or 0):.2f}% on {len(records)} steps ({time.perf_counter() - t0:.1f} s)"
        )
    return tables


def evaluate_policy_splits(
    policy: Policy, splits: dict[str, list[Episode]], config: ml_collections.ConfigDict, out_dir: Path, echo=print
) -> dict:
    """A round's evaluation record: ``metrics`` (the test splits), ``blank`` (``config.eval.blank_splits`` with
    blank screenshots: how much accuracy comes from reading the screen) and ``dev`` (the early-stopping signal)."""
    test = list(config.data.test_splits)
    out = {"metrics": evaluate_splits(policy, splits, test, config, out_dir, echo=echo)}
    blank = [s for s in config.eval.blank_splits if s]
    if blank:
        out["blank"] = evaluate_splits(policy, splits, blank, config, out_dir, echo=echo, blank_screens=True)
    return out


def dev_accuracy(policy: Policy, dev_episodes: Sequence[Episode], config: ml_collections.ConfigDict) -> dict:
    """Dev step / type accuracy of greedy decoding (the round loop's early-stopping signal)."""
    from ipl_jax.eval.evaluate import evaluate_policy

    episodes = limit_episodes(dev_episodes, int(config.eval.max_steps))
    _, table = evaluate_policy(
        policy.params, policy.cfg, policy.tokenizer, episodes, eval_config(policy, config), policy.mesh
    )
    return {"step_accuracy": float(table["step_acc"] or 0.0), "type_accuracy": float(table["total"]["type_acc"] or 0)}


# ------------------------------------------------------------------------------------------------ round config


@dataclasses.dataclass(frozen=True)
class IPLSettings:
    """The job's ``ipl`` section, typed and checked once (``ipl_settings``); every field is documented in
    ``configs/synthetic.py``."""

    rounds: int
    steps_per_round: int
    round_fraction: float
    method: str
    loss_kind: str
    beta: float
    sft_weight: float
    sft_norm: str
    learning_rate: float
    later_learning_rate: float
    schedule: str
    warmup_steps: int
    lora_rank: int
    batch_size: int
    max_pairs_per_batch: int
    text_buckets: tuple
    max_pairs_per_tree: int
    max_gamma_pairs_per_tree: int
    gamma_pairs: str
    pair_turns: tuple
    dedup: bool
    type_balance: float
    mix_trees: bool
    freeze_vision: bool
    early_stop: bool

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"config.ipl.{field}: {why} (got {getattr(self, field)!r})")

        if self.method not in METHODS:
            bad("method", f"must be one of {', '.join(METHODS)}")
        if self.gamma_pairs not in GAMMA_MODES:
            bad("gamma_pairs", f"must be one of {', '.join(GAMMA_MODES)}")
        if self.sft_norm not in ("token", "sum"):
            bad("sft_norm", "must be token or sum")
        if not self.pair_turns or not set(self.pair_turns) <= {1, 2, 3, 4}:
            bad("pair_turns", "must be a non-empty subset of 1, 2, 3, 4")
        if self.schedule not in ("constant", "cosine"):
            bad("schedule", "must be constant or cosine")
        for f in ("learning_rate", "beta"):
            if not getattr(self, f) > 0:
                bad(f, "must be > 0")
        for f in ("later_learning_rate", "sft_weight", "type_balance", "round_fraction"):
            if getattr(self, f) < 0:
                bad(f, "must be >= 0")
        for f in ("rounds", "batch_size", "max_pairs_per_batch"):
            if getattr(self, f) < 1:
                bad(f, "must be >= 1")
        for f in ("warmup_steps", "steps_per_round", "max_pairs_per_tree", "max_gamma_pairs_per_tree", "lora_rank"):
            if getattr(self, f) < 0:
                bad(f, "must be >= 0")

    @property
    def gamma_cap(self) -> int:
        return self.max_gamma_pairs_per_tree if self.max_gamma_pairs_per_tree > 0 else self.max_pairs_per_tree

    def lr(self, round_index: int) -> float:
        """Round 1's learning rate, or ``later_learning_rate`` for later rounds when it is set."""
        return self.learning_rate if round_index <= 1 or self.later_learning_rate <= 0 else self.later_learning_rate


def ipl_settings(config: ml_collections.ConfigDict) -> IPLSettings:
    """The ``ipl`` section as ``IPLSettings`` (raises ValueError naming a bad field)."""
    c = config.ipl
    kinds = {f.name: f.type for f in dataclasses.fields(IPLSettings)}
    values = {}
    for name, kind in kinds.items():
        v = c[name]
        if kind == "tuple":
            values[name] = tuple(int(x) for x in v)
        elif kind == "bool":
            values[name] = bool(v)
        else:
            values[name] = {"int": int, "float": float, "str": str}[kind](v)
    return IPLSettings(**values)


def tdpo_config(config: ml_collections.ConfigDict, cfg, round_index: int = 1):
    from ipl_jax.preference.losses import DPOConfig
    from ipl_jax.preference.tdpo import TDPOConfig

    s = ipl_settings(config)
    compute, storage = job_precision(config)
    return TDPOConfig(
        model=job_model_config(config, cfg),
        remat=job_remat(config),
        compute_dtype=None if compute == "float32" else compute,
        reference_dtype=storage,
        dpo=DPOConfig(beta=s.beta, sft_weight=s.sft_weight, kind=s.loss_kind, sft_norm=s.sft_norm),
        objective="positive_sft" if s.method == "no_negatives" else "tdpo",
        learning_rate=s.lr(round_index),
        schedule=s.schedule,
        warmup_steps=s.warmup_steps,
        grad_clip_norm=float(config.sft.grad_clip),
    )


def round_config(config: ml_collections.ConfigDict, cfg, tokenizer, round_index: int = 1):
    """The ``preference.round.RoundConfig`` of a round."""
    from ipl_jax.preference.packing import PackingConfig
    from ipl_jax.preference.pairs import PairConfig
    from ipl_jax.preference.round import RoundConfig
    from ipl_jax.preference.selection import SelectionConfig

    s = ipl_settings(config)
    k = max(int(b) for b in config.sampler.branching)
    packing = PackingConfig(
        rows=s.batch_size,
        max_continuations=k + 1,
        max_pairs=s.max_pairs_per_batch,
        text_buckets=s.text_buckets,
        patch_buckets=tuple(int(p) * s.batch_size for p in config.buckets.patches),
        pad_id=int(tokenizer.ids.pad),
    )
    pairs = PairConfig(
        max_beta_pairs_per_tree_turn=s.max_pairs_per_tree,
        max_gamma_pairs_per_tree_turn=0 if s.gamma_pairs == "none" else s.gamma_cap,
        gamma_action_pairs=s.gamma_pairs in ("paper", "consistent"),
        gamma_grounding_pairs=s.gamma_pairs != "none",
        turns=s.pair_turns,
    )
    tdpo = tdpo_config(config, cfg, round_index)
    return RoundConfig(
        tdpo=tdpo,
        packing=packing,
        pairs=pairs,
        pair_mode="naive" if s.method == "naive_dpo" else "tdpo",
        selection=SelectionConfig(dedup=s.dedup, type_balance=s.type_balance, mix_trees=s.mix_trees),
        train_on="golden" if s.method == "continued_sft" else "pairs",
        gamma_consistent_only=s.gamma_pairs == "consistent",
    )


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
    """``RoundStages.golden_update`` of the ``continued_sft`` control: ``n`` supervised updates with the round's
    optimizer on the golden CoaT of ``steps``, ``ipl.batch_size`` dialogues per update, epochs in seeded orders."""
    from ipl_jax.pipeline.sft_stage import SFTItem, make_batch_fn, make_example_fn
    from ipl_jax.preference.tdpo import round_schedule, summarize_steps
    from ipl_jax.training.sft import make_qwen2vl_sft_step

    bs = min(int(config.ipl.batch_size), len(steps))
    sft_like = ml_collections.ConfigDict(config.to_dict())
    sft_like.sft.batch_size, sft_like.sft.micro_batch_size = bs, min(bs, int(config.sft.micro_batch_size) or bs)
    while bs % sft_like.sft.micro_batch_size:
        sft_like.sft.micro_batch_size -= 1
    example = make_example_fn(policy.tokenizer, policy.image_config)
    batch_fn = make_batch_fn(policy.cfg, policy.tokenizer, sft_like)
    n_micro = bs // int(sft_like.sft.micro_batch_size)

    def update(state, n_updates: int, rng):
        tdpo = round_schedule(rcfg.tdpo, n_updates)
        step_fn = make_qwen2vl_sft_step(
            tdpo.model,
            tdpo.optimizer(),
            tdpo.schedule_fn(),
            grad_accum_steps=n_micro,
            remat=tdpo.remat,
            compute_dtype=tdpo.compute_dtype,
        )
        seed = [int(x) for x in np.asarray(jax.device_get(rng), np.uint32).reshape(-1)]
        order_rng = np.random.default_rng(seed)
        order: list[int] = []
        per_step = []
        for _ in range(n_updates):
            if len(order) < bs:
                order.extend(order_rng.permutation(len(steps)).tolist())
            chosen, order = order[:bs], order[bs:]
            state, m = step_fn(state, batch_fn([example(SFTItem(steps[i])) for i in chosen]))
            per_step.append({k: float(v) for k, v in jax.device_get(m).items()})
        for m in per_step:
            m.setdefault("pairs", float(bs))  # weight for the round means: dialogues per update
        out = summarize_steps(per_step)
        out["per_step"] = per_step
        return state, out

    return update


def run_round(
    config: ml_collections.ConfigDict,
    wd: Workdir,
    round_index: int,
    start: Path,
    train_steps: Sequence[Step],
    dev_episodes: Sequence[Episode],
) -> dict:
    """One IPL round from the policy directory ``start``; writes ``rounds/<r>/policy``, ``trees.jsonl`` (a few
    sampled trees for the viewer) and ``round.json``. Returns the round record of ``ipl_round`` plus ``dev``
    (the new policy's dev accuracy) and ``policy``."""
    from ipl_jax.eval.trees import iter_tree_batches, round_scores, sampled_trees, sampler_config, score_batch
    from ipl_jax.preference.round import RoundStages, ipl_round
    from ipl_jax.preference.tdpo import init_state
    from ipl_jax.sampling.tree_records import tree_record, turn_texts
    from ipl_jax.training.state import VISION_REGEX, model_params

    s = ipl_settings(config)
    policy = load_policy(start, job_mesh(config))
    steps = round_steps(train_steps, config, round_index)
    rcfg = round_config(config, policy.cfg, policy.tokenizer, round_index)
    sconfig = sampler_config(config, policy.tokenizer)
    out_dir = wd.dir("rounds", str(round_index))
    kept_trees: list[tuple[dict, Step]] = []
    pending: dict[int, tuple] = {}
    n_view = int(config.export.viewer_steps)

    def sample(params, _n, rng):
        current = inference_policy(policy, config, params)  # storage-dtype weights, KV cache in the compute dtype
        seed = int(jax.random.randint(rng, (), 0, 2**31 - 1))
        for batch in iter_tree_batches(current, steps, sconfig, seed, int(config.sampler.batch_size)):
            sampled = sampled_trees(batch, policy.tokenizer)
            pending[id(sampled)] = (batch, turn_texts(batch.tree, policy.tokenizer))
            yield sampled

    def score(sampled):
        batch, texts = pending.pop(id(sampled))
        actions, scores = score_batch(batch, texts, config)
        for row, step in enumerate(batch.steps):
            if len(kept_trees) < n_view and bool(batch.tree.step_valid[row]):
                kept_trees.append(
                    (tree_record(batch.tree, row, texts, actions, scores, step, float(config.reward.discount)), step)
                )
        return round_scores(batch, texts, actions, scores)

    golden = golden_update_fn(config, policy, steps, rcfg) if rcfg.train_on == "golden" else None
    rng = jax.random.PRNGKey(int(config.seed) * 7919 + round_index)
    _, storage = job_precision(config)
    frozen = None if storage == "float32" else storage  # frozen base / vision tower; trained weights stay fp32
    if s.lora_rank > 0:
        from ipl_jax.training.lora import LoraConfig

        lora = LoraConfig(rank=s.lora_rank, alpha=float(2 * s.lora_rank))
        state = init_state(policy.params, rcfg.tdpo, rng, lora=lora, frozen_dtype=frozen)
    else:
        vision = VISION_REGEX if s.freeze_vision else None
        state = init_state(policy.params, rcfg.tdpo, rng, freeze_regex=vision, frozen_dtype=frozen)
    state, record = ipl_round(
        state, rcfg, RoundStages(sample=sample, score=score, golden_update=golden), round_index, rng, mesh=policy.mesh
    )
    params = model_params(state.params, state.frozen)
    del state
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
    write_trees(out_dir, kept_trees, f"IPL round {round_index}: trees sampled with the round's starting policy")
    write_json(out_dir / "round.json", record)
    record["policy"] = str(out_dir / "policy")
    return record


def write_trees(out_dir: Path, kept: Sequence[tuple[dict, Step]], title: str) -> None:
    """``trees.jsonl`` (one ``tree_record`` per line) and ``trees.html`` (the viewer, screenshots inline)."""
    from ipl_jax.viz.viewer import write_html

    with open(out_dir / "trees.jsonl", "w", encoding="utf-8") as f:
        for record, _ in kept:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_html(out_dir / "trees.html", [r for r, _ in kept], [s.load_image() for _, s in kept], title=title)
