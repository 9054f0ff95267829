"""Stages 6 and 7: evaluation of a policy on the test splits, and IPL rounds.

Each round is one call of ``ipl.run_rounds`` (``num_rounds=1``) with the pipeline's pieces plugged in as its
``RoundStages``: ``sample`` draws CoaT-trees on the round's training steps with the round's starting policy,
``score`` gives leaf rewards and backed-up values (``pipeline.trees``), ``evaluate`` is greedy decoding on the dev
split. The round's policy is written as ``WORKDIR/rounds/<r>/policy`` with a marker, so a killed job resumes at
the next unfinished round. Early stopping (``config.ipl.early_stop``): stop after the first round whose dev step
accuracy does not beat the best so far (the seed's included).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

import jax
import ml_collections

from ipl_jax.data.records import Episode, Step
from ipl_jax.pipeline.model_stage import Policy, job_mesh, load_policy, write_policy_dir
from ipl_jax.pipeline.workdir import Workdir, write_json

METHODS = ("tdpo", "naive_dpo", "no_negatives")


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


def eval_config(policy: Policy, config: ml_collections.ConfigDict):
    """``evaluate.EvalConfig`` of the job: its sampler settings (made greedy), the policy's image settings."""
    from ipl_jax.eval.evaluate import EvalConfig
    from ipl_jax.pipeline.data_stage import scoring_format
    from ipl_jax.pipeline.trees import sampler_config

    return EvalConfig(sampler=sampler_config(config, policy.tokenizer), image_config=policy.image_config,
                      batch_size=int(config.eval.batch_size), fmt=scoring_format(config), seed=int(config.seed))


def evaluate_splits(policy: Policy, splits: dict[str, list[Episode]], names: Sequence[str],
                    config: ml_collections.ConfigDict, out_dir: Path, echo=print) -> dict:
    """Greedy CoaT decoding + the Step.Acc table (the ``ipl-jax score`` JSON) of each split in ``names``
    (``evaluate.evaluate_policy``); predictions go to ``out_dir/<split>.predictions.jsonl``."""
    from ipl_jax.eval.evaluate import evaluate_policy

    out_dir.mkdir(parents=True, exist_ok=True)
    ec = eval_config(policy, config)
    tables = {}
    for name in names:
        t0 = time.perf_counter()
        episodes = limit_episodes(splits[name], int(config.eval.max_steps))
        records, table = evaluate_policy(policy.params, policy.cfg, policy.tokenizer, episodes, ec, policy.mesh)
        with open(out_dir / f"{name}.predictions.jsonl", "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        tables[name] = table
        echo(f"  {name}: step accuracy {100 * (table['step_acc'] or 0):.2f}% on {len(records)} steps "
             f"({time.perf_counter() - t0:.1f} s)")
    return tables


def dev_accuracy(policy: Policy, dev_episodes: Sequence[Episode], config: ml_collections.ConfigDict) -> dict:
    """Dev step / type accuracy of greedy decoding (the round loop's early-stopping signal)."""
    from ipl_jax.eval.evaluate import evaluate_policy

    episodes = limit_episodes(dev_episodes, int(config.eval.max_steps))
    _, table = evaluate_policy(policy.params, policy.cfg, policy.tokenizer, episodes, eval_config(policy, config),
                               policy.mesh)
    return {"step_accuracy": float(table["step_acc"] or 0.0), "type_accuracy": float(table["total"]["type_acc"] or 0)}


# ------------------------------------------------------------------------------------------------ round config


def tdpo_config(config: ml_collections.ConfigDict, cfg, round_index: int = 1):
    from ipl_jax.preference.tdpo import TDPOConfig
    from ipl_jax.preference.losses import DPOConfig

    method = str(config.ipl.method)
    if method not in METHODS:
        raise ValueError(f"config.ipl.method must be one of {METHODS}, got {method!r}")
    return TDPOConfig(model=cfg, dpo=DPOConfig(beta=float(config.ipl.beta), sft_weight=float(config.ipl.sft_weight),
                                               kind=str(config.ipl.loss_kind)),
                      objective="positive_sft" if method == "no_negatives" else "tdpo",
                      learning_rate=learning_rate(config, round_index), schedule="constant",
                      grad_clip_norm=float(config.sft.grad_clip))


def learning_rate(config: ml_collections.ConfigDict, round_index: int) -> float:
    later = float(config.ipl.later_learning_rate)
    return float(config.ipl.learning_rate) if round_index <= 1 or later <= 0 else later


def round_config(config: ml_collections.ConfigDict, cfg, tokenizer, round_index: int = 1):
    from ipl_jax.preference.tdpo import RoundConfig
    from ipl_jax.preference.packing import PackingConfig
    from ipl_jax.preference.pairs import PairConfig

    k = max(int(b) for b in config.sampler.branching)
    rows = int(config.ipl.batch_size)
    packing = PackingConfig(rows=rows, max_continuations=k + 1, max_pairs=int(config.ipl.max_pairs_per_batch),
                            text_buckets=tuple(int(t) for t in config.ipl.text_buckets),
                            patch_buckets=tuple(int(p) * rows for p in config.buckets.patches),
                            pad_id=int(tokenizer.ids.pad))
    cap = int(config.ipl.max_pairs_per_tree)
    pairs = PairConfig(max_beta_pairs_per_tree_turn=cap, max_gamma_pairs_per_tree_turn=cap)
    return RoundConfig(tdpo=tdpo_config(config, cfg, round_index), packing=packing, pairs=pairs,
                       pair_mode="naive" if config.ipl.method == "naive_dpo" else "tdpo", num_rounds=1,
                       patience=1, evaluate_seed=False)


def round_steps(train_steps: Sequence[Step], config: ml_collections.ConfigDict, round_index: int) -> list[Step]:
    """The training steps whose trees are sampled in a round: a seeded sample per round (all when
    ``steps_per_round`` is 0 or exceeds the data)."""
    from ipl_jax.eval.seed_selection import sample_steps

    n = int(config.ipl.steps_per_round)
    if float(config.ipl.round_fraction) > 0:
        n = max(1, round(float(config.ipl.round_fraction) * len(train_steps)))
    return sample_steps(train_steps, n, int(config.seed) * 1000 + round_index)


# ------------------------------------------------------------------------------------------------ one round


def run_round(config: ml_collections.ConfigDict, wd: Workdir, round_index: int, start: Path,
              train_steps: Sequence[Step], dev_episodes: Sequence[Episode]) -> dict:
    """One IPL round from the policy directory ``start``; writes ``rounds/<r>/policy`` and ``trees.jsonl``
    (a few sampled trees for the viewer). Returns the round record of ``ipl.run_rounds`` plus ``policy``."""
    from ipl_jax.preference.tdpo import RoundStages, init_state, run_rounds
    from ipl_jax.pipeline.trees import iter_tree_batches, round_scores, sampled_trees, sampler_config, score_batch
    from ipl_jax.sampling.tree_records import tree_record, turn_texts
    from ipl_jax.training.train import VISION_REGEX, model_params

    policy = load_policy(start, job_mesh(config))
    rcfg = round_config(config, policy.cfg, policy.tokenizer, round_index)
    sconfig = sampler_config(config, policy.tokenizer)
    steps = round_steps(train_steps, config, round_index)
    out_dir = wd.dir("rounds", str(round_index))
    kept_trees: list[tuple[dict, Step]] = []
    pending: dict[int, tuple] = {}
    n_view = int(config.export.viewer_steps)

    def sample(params, _n, rng):
        current = dataclasses.replace(policy, params=params)
        seed = int(jax.random.randint(rng, (), 0, 2 ** 31 - 1))
        for batch in iter_tree_batches(current, steps, sconfig, seed, int(config.sampler.batch_size)):
            sampled = sampled_trees(batch, policy.tokenizer)
            pending[id(sampled)] = (batch, turn_texts(batch.tree, policy.tokenizer))
            yield sampled

    def score(sampled):
        batch, texts = pending.pop(id(sampled))
        actions, scores = score_batch(batch, texts, config)
        for row, step in enumerate(batch.steps):
            if len(kept_trees) < n_view and bool(batch.tree.step_valid[row]):
                kept_trees.append((tree_record(batch.tree, row, texts, actions, scores, step,
                                               float(config.reward.discount)), step))
        return round_scores(batch, texts, actions, scores)

    def evaluate(params, _n):
        current = dataclasses.replace(policy, params=params)
        return dev_accuracy(current, dev_episodes, config)

    rng = jax.random.PRNGKey(int(config.seed) * 7919 + round_index)
    if int(config.ipl.lora_rank) > 0:
        from ipl_jax.training.lora import LoraConfig

        rank = int(config.ipl.lora_rank)
        state = init_state(policy.params, rcfg.tdpo, rng, lora=LoraConfig(rank=rank, alpha=float(2 * rank)))
    else:
        state = init_state(policy.params, rcfg.tdpo, rng,
                           freeze_regex=VISION_REGEX if bool(config.ipl.freeze_vision) else None)
    state, history = run_rounds(state, rcfg, RoundStages(sample=sample, score=score, evaluate=evaluate), rng,
                                mesh=policy.mesh,
                                log=lambda msg: wd.echo("  " + msg.replace("round 1", f"round {round_index}", 1)))
    record = dict(history[-1])
    record["round"] = round_index
    params = model_params(state.params, state.frozen)
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
