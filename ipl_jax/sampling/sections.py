"""How CoaT-trees are sampled, declared once: the tree shape, the token filter and the prompt buckets. The tree
sampler's static ``config.SamplerConfig`` extends ``TreeSampling`` (with the turn budgets, temperatures and ids of one
batch); the job's ``sampler`` section holds one as ``sampler.tree``. Importing this module loads no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.sections import Section, is_positive


@dataclasses.dataclass(frozen=True)
class TreeSampling(Section):
    """A CoaT-tree's shape and how its tokens are drawn (docs/method.md §3)."""

    PATH: ClassVar[str] = "sampler.tree"
    branching: tuple[int, ...] = (3, 3, 3, 1)
    """Children per node at each of the four CoaT turns."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1: off)."""
    prefix_buckets: tuple[int, ...] = (96, 128, 192, 256)
    """Prefix lengths: screenshot + first prompt."""
    prompt_buckets: tuple[int, ...] = (32, 64, 128, 192)
    """Lengths of the turn-2..4 prompts (turn 2 holds the history)."""

    def __post_init__(self):
        self.need(
            "branching",
            len(self.branching) == 4 and min(self.branching) >= 1,
            "must be four integers >= 1 (children per node at each CoaT turn)",
        )
        self.need("top_p", is_positive(self.top_p) and self.top_p <= 1, "must be in (0, 1]")
        self.at_least("top_k", 0, " (0: off)")
        for name in ("prefix_buckets", "prompt_buckets"):
            values = getattr(self, name)
            self.need(name, bool(values) and min(values) >= 1, "must be one or more lengths >= 1")
