"""Stage ``start``: the starting policy of the IPL rounds, chosen among warm-up SFT's candidates by Acc_S + w · Div_R
(docs/method.md §9) and copied to ``WORKDIR/start``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ipl_jax import storage
from ipl_jax.data.records import Step, sample_steps
from ipl_jax.eval.start_selection import choose, format_scores, score_candidates
from ipl_jax.pipeline import sft_stage
from ipl_jax.pipeline.eval_stage import start_scoring
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.settings import Settings


def select_start(
    settings: Settings,
    wd: Workdir,
    sft_summary: dict,
    train_steps: Sequence[Step],
    policies: Callable[[Sequence[Path]], list],
) -> dict:
    """Scores SFT's candidate policies (``policies(paths)``: ``(name, inference policy)`` each) on a seeded sample of
    ``start_selection.steps`` training steps, copies the chosen one to ``start/`` and returns the stage summary."""
    s = settings
    paths = sft_stage.candidate_policies(sft_summary)
    steps = sample_steps(train_steps, s.start_selection.steps, s.seed)
    scores, kind = score_candidates(
        policies(paths), steps, **start_scoring(s), embedder=s.start_selection.embedder, echo=wd.echo
    )
    chosen = choose(scores, s.start_selection.diversity_weight)
    for line in format_scores(scores, chosen).splitlines():
        wd.echo("  " + line)
    target = wd.path("start")
    if wd.main:
        storage.copy_tree(paths[chosen], target)
    return {
        "candidates": [c.to_json() for c in scores],
        "chosen": paths[chosen].name,
        "embedder": kind,
        "steps": len(steps),
        "policy": str(target),
        "trees": {k: getattr(scores[chosen], k) for k in ("alpha", "beta", "gamma")},
    }
