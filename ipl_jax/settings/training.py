"""Warm-up SFT (``sft``), seed selection (``seed_selection``), CoaT-tree sampling (``sampler``) and the leaf
reward (``reward``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.settings.base import Section, _nonneg, _one_of, _positive


@dataclasses.dataclass(frozen=True)
class SFTSettings(Section):
    PATH: ClassVar[str] = "sft"
    steps: int
    batch_size: int
    micro_batch_size: int
    learning_rate: float
    warmup_steps: int
    schedule: str
    weight_decay: float
    grad_clip: float
    checkpoint_every: int
    seed_candidates: int
    freeze_vision: bool
    lora_rank: int

    def __post_init__(self):
        from ipl_jax.training.optimizer import SCHEDULES  # see the names above

        self.at_least("steps warmup_steps lora_rank", 0)
        self.at_least("batch_size checkpoint_every seed_candidates", 1)
        self.at_least("micro_batch_size", 0, " (0: no micro-batches)")
        self.need("micro_batch_size", self.batch_size % self.micro == 0, "must divide sft.batch_size")
        self.need("learning_rate", _positive(self.learning_rate), "must be > 0")
        self.need("weight_decay", _nonneg(self.weight_decay), "must be >= 0")
        self.need("grad_clip", _nonneg(self.grad_clip), "must be >= 0 (0: no clipping)")
        self.need("schedule", self.schedule in SCHEDULES, _one_of(SCHEDULES))

    @property
    def micro(self) -> int:
        """Dialogues per micro-batch (gradients accumulated over ``batch_size / micro`` of them)."""
        return self.micro_batch_size or self.batch_size


@dataclasses.dataclass(frozen=True)
class SeedSelectionSettings(Section):
    PATH: ClassVar[str] = "seed_selection"
    steps: int
    diversity_weight: float
    embedder: str

    def __post_init__(self):
        from ipl_jax.eval.embeddings import EMBEDDERS  # see the names above

        self.at_least("steps", 1)
        self.need("diversity_weight", _nonneg(self.diversity_weight), "must be >= 0")
        self.need("embedder", self.embedder in EMBEDDERS, _one_of(EMBEDDERS))


@dataclasses.dataclass(frozen=True)
class SamplerSettings(Section):
    PATH: ClassVar[str] = "sampler"
    branching: tuple[int, ...]
    temperature: float
    top_k: int
    top_p: float
    batch_size: int
    prefix_buckets: tuple[int, ...]
    prompt_buckets: tuple[int, ...]

    def __post_init__(self):
        self.need(
            "branching",
            len(self.branching) == 4 and min(self.branching) >= 1,
            "must be four integers >= 1 (children per node at each CoaT turn)",
        )
        self.need("temperature", _nonneg(self.temperature), "must be >= 0")
        self.need("top_p", _positive(self.top_p) and self.top_p <= 1, "must be in (0, 1]")
        self.at_least("top_k", 0, " (0: off)")
        self.at_least("batch_size", 1)
        for name in ("prefix_buckets", "prompt_buckets"):
            values = getattr(self, name)
            self.need(name, bool(values) and min(values) >= 1, "must be one or more lengths >= 1")


@dataclasses.dataclass(frozen=True)
class RewardSettings(Section):
    """v_type / v_format: the leaf reward's shares for the action type and a parsable argument (method.md §4);
    discount: c of the value backup (§5)."""

    PATH: ClassVar[str] = "reward"
    v_type: float
    v_format: float
    discount: float

    def __post_init__(self):
        self.need("v_type", _nonneg(self.v_type), "must be >= 0")
        self.need("v_format", _nonneg(self.v_format), "must be >= 0")
        self.need("v_format", self.v_type + self.v_format <= 1, "reward.v_type + reward.v_format must be <= 1")
        self.need("discount", _positive(self.discount) and self.discount <= 1, "must be in (0, 1]")
