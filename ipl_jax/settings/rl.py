"""The RL learners' section (``rl``), run by ``ipl.method`` grpo | ppo | gigppo: ``rl.grpo`` and ``rl.ppo`` (the
library's own sections, ``ipl_jax.rl.sections``) and their training rows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.rl.sections import GRPOSettings, PPOSettings
from ipl_jax.sections import Section


@dataclasses.dataclass(frozen=True)
class RLSettings(Section):
    PATH: ClassVar[str] = "rl"
    grpo: GRPOSettings = dataclasses.field(default_factory=GRPOSettings)
    """GRPO (ipl.method = grpo)."""
    ppo: PPOSettings = dataclasses.field(default_factory=PPOSettings)
    """PPO / GiGPPO (ipl.method = ppo | gigppo)."""
    row_buckets: tuple[int, ...] = (384, 512, 640, 768)
    """RL training row lengths (prompt + sampled CoaT)."""

    def __post_init__(self):
        self.need(
            "row_buckets",
            bool(self.row_buckets) and min(self.row_buckets) >= 1,
            "must be one or more lengths >= 1 (training rows: prompt + sampled CoaT)",
        )
