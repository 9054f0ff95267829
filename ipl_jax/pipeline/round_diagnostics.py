"""The job's probe of an IPL round (``preference.round.RoundProbe``): held-out pairs on fixed dev steps, and the
round's ``ipl.diagnostic_steps`` sampled by π(n-1) and π(n) with the same seed and decoded greedily
(``_before`` / ``_after`` figures in the record's ``diagnostics``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from ipl_jax.data.records import Step, sample_steps
from ipl_jax.eval.evaluate import evaluate_policy
from ipl_jax.eval.trees import LeafTally, iter_tree_batches, round_scores, row_tallies, sampled_trees, score_batch
from ipl_jax.pipeline.eval_stage import eval_config
from ipl_jax.pipeline.model_stage import Policy, inference_policy
from ipl_jax.pipeline.seeds import round_seed
from ipl_jax.preference.round import RoundProbe
from ipl_jax.progress import progress
from ipl_jax.sampling.tree_records import turn_texts
from ipl_jax.settings import Settings


def _seed(rng) -> int:
    return int(jax.random.randint(rng, (), 0, 2**31 - 1))


class RoundDiagnostics:
    """The probe of one round: ``heldout``, ``before`` and ``after`` (``probe()`` bundles them)."""

    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        round_steps: Sequence[Step],
        dev_steps: Sequence[Step],
        sconfig,
        round_index: int,
    ):
        ipl, seed = settings.ipl, settings.seed
        self.settings, self.policy, self.sconfig, self.round_index = settings, policy, sconfig, round_index
        self.reward = settings.reward.build(settings.data.rules())
        self.steps = sample_steps(round_steps, ipl.diagnostic_steps, round_seed(seed, round_index, "diagnostic_steps"))
        self.heldout_steps = sample_steps(dev_steps, ipl.heldout_steps, seed) if ipl.heldout_steps > 0 else []
        self.tally_seed = round_seed(seed, round_index, "rng")  # the same draws before and after the update

    # ------------------------------------------------------------------------------------------- trees

    def _trees(self, params, steps: Sequence[Step], seed: int, desc: str):
        """(batch, turn texts, leaf actions, ``eval.trees`` scores) of trees that ``params`` samples on ``steps``."""
        current = inference_policy(self.policy, self.settings.model, params)
        bs = self.settings.sampler.batch_size
        batches = iter_tree_batches(current, steps, self.sconfig, seed, bs)
        for batch in progress(batches, total=-(-len(steps) // bs), desc=desc, unit="batch"):
            texts = turn_texts(batch.tree, self.policy.tokenizer)
            actions, scores = score_batch(batch, texts, self.reward, self.settings.reward.discount)
            yield batch, texts, actions, scores

    def heldout(self, params, rng):
        """Trees of π(n-1) on the held-out dev steps, as the round's ``(SampledTrees, TreeScores)``."""
        if not self.heldout_steps:
            return
        desc = f"round {self.round_index} held-out trees"
        for batch, texts, actions, scores in self._trees(params, self.heldout_steps, _seed(rng), desc):
            yield sampled_trees(batch, self.policy.tokenizer), round_scores(batch, texts, actions, scores)

    def _tally(self, params, when: str) -> LeafTally:
        total = LeafTally()
        desc = f"round {self.round_index} trees {when}"
        for batch, texts, actions, scores in self._trees(params, self.steps, self.tally_seed, desc):
            for tally in row_tallies(texts, actions, scores.exact, batch.steps, batch.tree.step_valid):
                total = total if tally is None else total + tally
        return total

    # ------------------------------------------------------------------------------------------- greedy

    def greedy(self, params) -> float | None:
        """Share of the probe's steps whose greedily decoded action matches the golden one."""
        if not self.steps:
            return None
        current = inference_policy(self.policy, self.settings.model, params)
        config = eval_config(current, self.settings)
        records, _ = evaluate_policy(current.params, current.cfg, current.tokenizer, self.steps, config, current.mesh)
        return float(np.mean([r["exact_match"] for r in records]))

    # ------------------------------------------------------------------------------------------- the probe

    def before(self, params) -> dict:
        return {"greedy": self.greedy(params), "tally": self._tally(params, "before")}

    def after(self, params, context: dict) -> dict:
        before, after = context["tally"], self._tally(params, "after")
        out = {"steps": len(self.steps)}
        for name, tally in (("before", before), ("after", after)):
            out.update({f"{k}_{name}": v for k, v in tally.figures().items()})
        out["greedy_before"], out["greedy_after"] = context["greedy"], self.greedy(params)
        return {"train_steps": out}

    def probe(self):
        return RoundProbe(heldout=self.heldout, before=self.before, after=self.after)
