"""Evaluation (``eval``), the final export (``export``) and the ablation (``ablation``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.data.synthetic.config import SPLITS
from ipl_jax.settings.base import Section


@dataclasses.dataclass(frozen=True)
class EvalSettings(Section):
    PATH: ClassVar[str] = "eval"
    batch_size: int
    max_steps: int
    every_round: bool
    blank_splits: tuple[str, ...]
    online_episodes: int
    online_splits: tuple[str, ...]
    online_max_steps: int

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
    viewer_steps: int

    def __post_init__(self):
        self.at_least("viewer_steps", 0)


@dataclasses.dataclass(frozen=True)
class AblationSettings(Section):
    PATH: ClassVar[str] = "ablation"
    variants: tuple[str, ...]
    rounds: int

    def __post_init__(self):
        self.at_least("rounds", 1)
