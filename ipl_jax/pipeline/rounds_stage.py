"""Stage ``rounds``: one IPL round (docs/method.md §6, §7) from the previous round's policy directory:
``preference.round.ipl_round`` with this module's ``RoundStages``; the new policy goes to
``WORKDIR/rounds/<r>/policy``. RL methods' rounds are ``pipeline.rl_round``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ipl_jax import distributed, storage
from ipl_jax.coat.tree import num_leaves
from ipl_jax.data.dialogue import annotated_steps
from ipl_jax.data.records import Episode, Step, sample_steps
from ipl_jax.eval.trees import iter_tree_batches, round_scores, sampled_trees, score_batch
from ipl_jax.pipeline.data_stage import oracle_steps, steps_of
from ipl_jax.pipeline.eval_stage import dev_accuracy
from ipl_jax.pipeline.model_stage import Policy, inference_policy, job_mesh, job_model_config, load_policy, write_round
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.rl_round import round_budget, run_rl_round
from ipl_jax.pipeline.round_diagnostics import RoundDiagnostics
from ipl_jax.pipeline.seeds import round_seed
from ipl_jax.pipeline.sft_stage import BatchShape, SFTItem, SFTRows, make_example_fn, sft_step_config
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.preference.round import RoundConfig, RoundStages, SampledTrees, TreeScores, ipl_round
from ipl_jax.preference.tdpo import init_state, round_schedule, summarize_steps
from ipl_jax.progress import progress
from ipl_jax.sampling.tree_records import tree_record, turn_texts
from ipl_jax.settings import RL_METHODS, Settings
from ipl_jax.training.loop import TrainLoop, place_state
from ipl_jax.training.lora import lora_of_rank
from ipl_jax.training.sft import sft_step
from ipl_jax.training.state import VISION_REGEX, model_params
from ipl_jax.viz.viewer import write_html

# ------------------------------------------------------------------------------------------ the round's configs


def round_steps(train_steps: Sequence[Step], settings: Settings, round_index: int) -> list[Step]:
    """The training steps a round samples: a seeded sample per round (all when ``steps_per_round`` is 0 or exceeds)."""
    n = settings.ipl.steps_in_round(len(train_steps))
    return sample_steps(train_steps, n, round_seed(settings.seed, round_index, "steps"))


# ------------------------------------------------------------------------------------------------ one round
#
# run_round, top to bottom: the round's steps and configs (golden_round_update for the supervised controls); its
# stages (sample_trees -> score_trees, each batch of trees with the round's starting policy; the diagnostics probe);
# the starting state (round_state); ``ipl_round`` (pairs from each scored batch, selection, packing, reference
# log-probs, the update); the new policy's dev accuracy; the files.


@dataclasses.dataclass(frozen=True)
class TreeBatch(SampledTrees):
    """One sampler batch of a round's CoaT-trees: ``SampledTrees`` plus the sampler's ``batch`` and decoded
    ``texts``."""

    batch: Any = None
    texts: Any = None


def sample_trees(
    policy: Policy, settings: Settings, sconfig, steps: Sequence[Step], params, round_index: int, rng
) -> Iterator[TreeBatch]:
    """``RoundStages.sample`` (once ``policy``, ``settings``, ``sconfig``, ``steps`` are bound): the CoaT-trees
    ``params`` samples on ``steps``, ``sampler.batch_size`` steps a batch, seeded by ``rng``."""
    current = inference_policy(policy, settings.model, params)
    seed = int(jax.random.randint(rng, (), 0, 2**31 - 1))
    bs = settings.sampler.batch_size
    batches = iter_tree_batches(current, steps, sconfig, seed, bs)
    for batch in progress(batches, total=-(-len(steps) // bs), desc=f"round {round_index} trees", unit="batch"):
        sampled = sampled_trees(batch, policy.tokenizer)
        yield TreeBatch(**vars(sampled), batch=batch, texts=turn_texts(batch.tree, policy.tokenizer))


@dataclasses.dataclass
class ViewerTrees:
    """The first ``limit`` valid trees a round scores, as ``(tree_record, step)``."""

    limit: int
    discount: float
    kept: list[tuple[dict, Step]] = dataclasses.field(default_factory=list)

    def keep(self, trees: TreeBatch, actions, scores) -> None:
        batch = trees.batch
        for row, step in enumerate(batch.steps):
            if len(self.kept) < self.limit and bool(batch.tree.step_valid[row]):
                record = tree_record(batch.tree, row, trees.texts, actions, scores, step, self.discount)
                self.kept.append((record, step))


def score_trees(trees: TreeBatch, reward, discount: float, viewer: ViewerTrees) -> TreeScores:
    """``RoundStages.score`` (once ``reward``, ``discount``, ``viewer`` are bound): leaf rewards and backed-up
    values of the batch; its first valid trees go to ``viewer``."""
    actions, scores = score_batch(trees.batch, trees.texts, reward, discount)
    viewer.keep(trees, actions, scores)
    return round_scores(trees.batch, trees.texts, actions, scores)


def golden_update_fn(settings: Settings, policy: Policy, steps: Sequence[Step], rcfg: RoundConfig):
    """The update of ``continued_sft`` / ``sft_oracle``, ``update(state, n, rng) -> (state, metrics)``: ``n``
    supervised updates on the golden CoaT of ``steps``. A step without CoaT raises before sampling (unless
    ``data.coat_fallback``)."""
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
        step_config = sft_step_config(policy.cfg, settings, tdpo.optimizer_settings, shape)
        seed = [int(x) for x in np.asarray(distributed.to_host(rng), np.uint32).reshape(-1)]
        order_rng = np.random.default_rng(seed)

        def batches():  # epochs over the golden steps in orders drawn from the round's key
            order: list[int] = []
            for _ in range(n_updates):
                if len(order) < bs:
                    order.extend(order_rng.permutation(len(steps)).tolist())
                chosen, order = order[:bs], order[bs:]
                yield rows.assemble(rows.local_batch([SFTItem(steps[i]) for i in chosen]))[0]

        loop = TrainLoop(
            lambda st, batch: sft_step(st, batch, step_config, mesh=mesh),
            kill_point="golden_sft_step",
            desc="continued SFT",
            place=functools.partial(place_state, optimizer=tdpo.optimizer(), mesh=mesh),
            in_flight=True,
        )
        state, per_step = loop.run(state, batches(), total=n_updates)
        # ``summarize_steps`` weights the round means by each step's "pairs" entry: here the dialogues per update
        dialogues = float(bs)
        for m in per_step:
            m.setdefault("pairs", dialogues)
        out = summarize_steps(per_step)
        out["per_step"] = per_step
        return state, out

    return update


def golden_round_update(settings: Settings, wd: Workdir, policy: Policy, steps, annotated, rcfg: RoundConfig):
    """``RoundStages.update`` of ``continued_sft`` / ``sft_oracle``: the golden update at the round's budget, one
    supervised update per packed batch of pairs."""
    golden = golden_update_fn(settings, policy, golden_steps(settings, wd, steps, annotated), rcfg)
    return lambda state, round_data, rng: golden(state, len(round_data.batches), rng)


def golden_steps(
    settings: Settings, wd: Workdir, steps: Sequence[Step], annotated: Sequence[Step] | None
) -> list[Step]:
    """What a supervised variant trains on: ``continued_sft`` the golden CoaT of the round's steps (of the annotated
    steps when those are action logs); ``sft_oracle`` the action-only steps' annotations read back."""
    if settings.ipl.method == "sft_oracle":
        return oracle_steps(settings.data, wd, steps)
    return list(annotated) if settings.data.scarce and annotated is not None else list(steps)


def round_state(settings: Settings, policy: Policy, rcfg: RoundConfig, rng):
    """The round's starting ``TrainState`` from π(n-1): LoRA of rank ``ipl.lora_rank`` or full weights
    (``ipl.freeze_vision``); frozen weights in the storage dtype, trained ones and moments in float32."""
    ipl = settings.ipl
    frozen = settings.model.precision().frozen_dtype
    if ipl.lora_rank > 0:
        return init_state(policy.params, rcfg.tdpo, rng, lora=lora_of_rank(ipl.lora_rank), frozen_dtype=frozen)
    vision = VISION_REGEX if ipl.freeze_vision else None
    return init_state(policy.params, rcfg.tdpo, rng, freeze_regex=vision, frozen_dtype=frozen)


def run_round(
    settings: Settings,
    wd: Workdir,
    round_index: int,
    start: Path,
    train_steps: Sequence[Step],
    dev_episodes: Sequence[Episode],
    annotated: Sequence[Step] | None = None,
) -> dict:
    """One IPL round from policy directory ``start``; writes ``rounds/<r>/policy``, ``trees.jsonl``, ``round.json``
    and returns ``ipl_round``'s record plus ``dev`` and ``policy``."""
    ipl = settings.ipl
    if ipl.method in RL_METHODS:
        return run_rl_round(settings, wd, round_index, start, train_steps, dev_episodes)
    # the round's steps and configs; the controls' update (golden CoaT) in place of T-DPO's
    policy = load_policy(start, job_mesh(settings.mesh))
    steps = round_steps(train_steps, settings, round_index)
    model, pad = job_model_config(policy.cfg, settings.model), policy.tokenizer.ids.pad
    rcfg = ipl.round(
        model, settings.model.precision(), settings.sft.grad_clip, settings.sampler, settings.buckets, pad, round_index
    )
    update = None
    if rcfg.train_on == "golden":
        update = golden_round_update(settings, wd, policy, steps, annotated, rcfg)
    sconfig = settings.sampler.build(policy.tokenizer.ids, settings.buckets, settings.eval.batch_size)
    reward = settings.reward.build(settings.data.rules())
    discount = settings.reward.discount
    # its stages: sample trees with π(n-1), score them (a few kept for the viewer), the probe
    viewer = ViewerTrees(limit=settings.export.viewer_steps, discount=discount)
    probe = None
    if ipl.diagnostics:
        probe = RoundDiagnostics(settings, policy, steps, steps_of(dev_episodes), sconfig, round_index).probe()
    stages = RoundStages(
        sample=functools.partial(sample_trees, policy, settings, sconfig, steps),
        score=functools.partial(score_trees, reward=reward, discount=discount, viewer=viewer),
        update=update,
        update_reads_reference=update is None,
        probe=probe,
    )
    # the round: pairs from each scored batch, selected and packed, then the update from π(n-1)'s state
    rng = jax.random.PRNGKey(round_seed(settings.seed, round_index, "rng"))
    state = round_state(settings, policy, rcfg, rng)
    state, record = ipl_round(state, rcfg, stages, round_index, rng, mesh=policy.mesh)
    params = model_params(state.params, state.frozen)
    del state
    # sampled completions (tree leaves) of the round: the budget the RL methods are given (rl_round.round_budget)
    record["samples"] = len(steps) * num_leaves(settings.sampler.tree.branching)
    record["budget"] = round_budget(ipl, settings.sampler.tree.branching, len(train_steps))
    t0 = time.perf_counter()
    record["dev"] = dev_accuracy(inference_policy(policy, settings.model, params), dev_episodes, settings)
    record["seconds"]["evaluate"] = time.perf_counter() - t0
    wd.echo(
        f"  round {round_index}: {record['pairs']} pairs, classes α {record['classes']['alpha']:.2f} "
        f"β {record['classes']['beta']:.2f} γ {record['classes']['gamma']:.2f}, "
        f"loss {record['train'].get('loss', float('nan')):.4f}, dev step accuracy "
        f"{record['dev']['step_accuracy']:.4f}, {record['seconds']['total']:.1f}s"
    )
    title = f"IPL round {round_index}: trees sampled with the round's starting policy"
    trees = functools.partial(write_trees, kept=viewer.kept, title=title)
    return write_round(wd, round_index, record, params, policy, start, extra=trees)


def write_trees(out_dir: Path, kept: Sequence[tuple[dict, Step]], title: str) -> None:
    """``trees.jsonl`` (one ``tree_record`` per line) and ``trees.html`` (the viewer)."""
    with storage.as_path(out_dir / "trees.jsonl").open("w", encoding="utf-8") as f:
        for record, _ in kept:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_html(out_dir / "trees.html", [r for r, _ in kept], [s.load_image() for _, s in kept], title=title)
