"""The IPL rounds (``ipl``) and the names of the methods a round can run."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.settings.base import Section, _nonneg, _one_of, _positive

RL_METHODS = ("grpo", "ppo", "gigppo")  # the other seeds' learners (pipeline/rl_round.py)
METHODS = ("tdpo", "naive_dpo", "no_negatives", "continued_sft", "sft_oracle", *RL_METHODS)
GOLDEN_METHODS = ("continued_sft", "sft_oracle")  # supervised training on golden CoaT at the round's update budget
GAMMA_MODES = ("paper", "consistent", "grounding", "none")


@dataclasses.dataclass(frozen=True)
class IPLSettings(Section):
    """The IPL rounds (docs/method.md §6, §7) and their ``method``: T-DPO, an ablation, the continued-SFT control or
    an RL learner (``RL_METHODS``)."""

    PATH: ClassVar[str] = "ipl"
    rounds: int
    steps_per_round: int
    round_fraction: float
    method: str
    loss_kind: str
    beta: float
    sft_weight: float
    sft_norm: str
    learning_rate: float
    later_learning_rate: float
    schedule: str
    warmup_steps: int
    lora_rank: int
    batch_size: int
    max_pairs_per_batch: int
    text_buckets: tuple[int, ...]
    max_pairs_per_tree: int
    max_gamma_pairs_per_tree: int
    gamma_pairs: str
    pair_turns: tuple[int, ...]
    dedup: bool
    type_balance: float
    mix_trees: bool
    freeze_vision: bool
    early_stop: bool
    diagnostics: bool
    diagnostic_steps: int
    heldout_steps: int

    def __post_init__(self):
        from ipl_jax.preference.losses import LOSS_KINDS, SFT_NORMS  # see the names above
        from ipl_jax.training.optimizer import SCHEDULES

        self.need("method", self.method in METHODS, _one_of(METHODS))
        self.need("loss_kind", self.loss_kind in LOSS_KINDS, _one_of(LOSS_KINDS))
        self.need("gamma_pairs", self.gamma_pairs in GAMMA_MODES, _one_of(GAMMA_MODES))
        self.need("sft_norm", self.sft_norm in SFT_NORMS, "must be token or sum")
        self.need("schedule", self.schedule in SCHEDULES, _one_of(SCHEDULES))
        self.need(
            "pair_turns",
            bool(self.pair_turns) and set(self.pair_turns) <= {1, 2, 3, 4},
            "must be a non-empty subset of 1, 2, 3, 4",
        )
        for name in ("learning_rate", "beta"):
            self.need(name, _positive(getattr(self, name)), "must be > 0")
        for name in ("later_learning_rate", "sft_weight", "type_balance", "round_fraction"):
            self.need(name, _nonneg(getattr(self, name)), "must be >= 0")
        self.at_least("rounds batch_size max_pairs_per_batch diagnostic_steps", 1)
        self.at_least(
            "warmup_steps steps_per_round max_pairs_per_tree max_gamma_pairs_per_tree lora_rank heldout_steps", 0
        )
        self.need("text_buckets", bool(self.text_buckets) and min(self.text_buckets) >= 1, "must be lengths >= 1")
        if self.method in RL_METHODS:
            self.need("lora_rank", self.lora_rank == 0, f"must be 0 with ipl.method={self.method} (full weights)")

    @property
    def gamma_cap(self) -> int:
        """γ pairs per (tree, turn): ``max_gamma_pairs_per_tree``, or ``max_pairs_per_tree`` when that is 0."""
        return self.max_gamma_pairs_per_tree if self.max_gamma_pairs_per_tree > 0 else self.max_pairs_per_tree

    def lr(self, round_index: int) -> float:
        """Round 1's learning rate, or ``later_learning_rate`` for later rounds when it is set."""
        return self.learning_rate if round_index <= 1 or self.later_learning_rate <= 0 else self.later_learning_rate

    def steps_in_round(self, n_train_steps: int) -> int:
        """Training steps a round samples: ``round_fraction`` of them, else ``steps_per_round`` (0: all)."""
        if self.round_fraction > 0:
            return max(1, round(self.round_fraction * n_train_steps))
        return self.steps_per_round or n_train_steps
