"""The leaf reward's shares, owned by the reward kernels: declared here once, extended by ``rewards.RewardConfig``
(the kernels' static settings, with the rule set) and held by the job's ``reward`` section as ``reward.shares``.
Importing this module loads no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.sections import Section, is_nonneg


@dataclasses.dataclass(frozen=True)
class LeafRewardShares(Section):
    """A leaf is worth 1 on an exact match, ``v_type`` + ``v_format`` + the argument's score on a type match
    (docs/method.md §4)."""

    PATH: ClassVar[str] = "reward.shares"
    v_type: float = 0.1
    """The leaf reward's share for the right action type (docs/method.md §4)."""
    v_format: float = 0.1
    """The leaf reward's share for a parsable argument."""

    def __post_init__(self):
        self.need("v_type", is_nonneg(self.v_type), "must be >= 0")
        self.need("v_format", is_nonneg(self.v_format), "must be >= 0")
        self.need(
            "v_format", self.v_type + self.v_format <= 1, "reward.shares.v_type + reward.shares.v_format must be <= 1"
        )
