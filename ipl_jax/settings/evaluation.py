"""Evaluation (``eval``), the final export (``export``) and the ablation (``ablation``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.envs.synthetic.config import SPLITS
from ipl_jax.sections import Section


@dataclasses.dataclass(frozen=True)
class EvalSettings(Section):
    PATH: ClassVar[str] = "eval"
    batch_size: int = 8
    """Steps per greedy evaluation batch."""
    max_steps: int = 0
    """Steps evaluated per split (0: every step)."""
    every_round: bool = True
    """Every round on the test splits (False: only the last; the others on dev only)."""
    blank_splits: tuple[str, ...] = ("test",)
    """Splits also evaluated with every screenshot grey (how much accuracy needs the screen)."""
    online_episodes: int = 40
    """Live-world episodes per online split, the policy acting greedily (0: off; eval/online.py)."""
    online_splits: tuple[str, ...] = ("test", "test_task_unseen")
    """Splits whose first episodes (world seeds, tasks) are played; results.json `online`: the first."""
    online_max_steps: int = 25
    """Step limit: min(this, 2 x the expert's steps); a cut episode is a failure."""

    def __post_init__(self):
        self.at_least("batch_size online_max_steps", 1)
        self.at_least("max_steps", 0, " (0: every step)")
        self.at_least("online_episodes", 0, " (0: no online evaluation)")
        self.need(
            "online_splits",
            len(self.online_splits) >= 1 and all(s in SPLITS for s in self.online_splits),
            f"must name one or more of {', '.join(SPLITS)}",
        )


@dataclasses.dataclass(frozen=True)
class ExportSettings(Section):
    PATH: ClassVar[str] = "export"
    viewer_steps: int = 4
    """Training steps whose sampled trees go into the HTML viewer."""

    def __post_init__(self):
        self.at_least("viewer_steps", 0)


@dataclasses.dataclass(frozen=True)
class AblationSettings(Section):
    PATH: ClassVar[str] = "ablation"
    variants: tuple[str, ...] = ("tdpo", "naive_dpo", "no_negatives", "no_evolution", "k2", "k3", "k4")
    """What `ipl-jax ablate` compares from one starting policy."""
    rounds: int = 1
    """IPL rounds per variant (the paper's ablation is on round 1)."""

    def __post_init__(self):
        self.at_least("rounds", 1)
