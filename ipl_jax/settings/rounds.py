"""The IPL rounds (``ipl``) and the names of the methods a round can run."""

from __future__ import annotations

import dataclasses
import typing
from typing import ClassVar

from ipl_jax.preference.sections import DPOSettings, PairSelection
from ipl_jax.sections import Section, is_nonneg, is_positive, one_of

if typing.TYPE_CHECKING:
    from ipl_jax.model.config import Qwen2VLConfig
    from ipl_jax.preference.round import RoundConfig
    from ipl_jax.preference.tdpo import TDPOConfig
    from ipl_jax.settings.model import BucketSettings
    from ipl_jax.settings.training import SamplerSettings
    from ipl_jax.training.optimizer import OptimizerSettings
    from ipl_jax.training.state import Precision

RL_METHODS = ("grpo", "ppo", "gigppo")  # the baselines' learners (pipeline/rl_round.py)
METHODS = ("tdpo", "naive_dpo", "no_negatives", "continued_sft", "sft_oracle", *RL_METHODS)
GOLDEN_METHODS = ("continued_sft", "sft_oracle")  # supervised training on golden CoaT at the round's update budget
GAMMA_MODES = ("paper", "consistent", "grounding", "none")


@dataclasses.dataclass(frozen=True)
class IPLSettings(Section):
    """The IPL rounds (docs/method.md §6, §7) and their ``method``: T-DPO, an ablation, the continued-SFT control or
    an RL learner (``RL_METHODS``). The T-DPO loss (``dpo``) and the pair selection (``selection``) are the preference
    library's own sections, handed to the round as they are."""

    PATH: ClassVar[str] = "ipl"
    dpo: DPOSettings = dataclasses.field(default_factory=DPOSettings)
    """The T-DPO loss: loss_kind, beta, sft_weight, sft_norm (preference/sections.py)."""
    selection: PairSelection = dataclasses.field(default_factory=PairSelection)
    """Which pairs a round trains on: dedup, type_balance, mix_trees (preference/sections.py)."""
    rounds: int = 2
    """IPL rounds."""
    steps_per_round: int = 64
    """Training steps (screens) whose trees are sampled each round (0: all)."""
    round_fraction: float = 0.0
    """> 0: sample this share of the training steps each round instead."""
    method: str = "tdpo"
    """tdpo | naive_dpo | no_negatives | continued_sft (the control: golden CoaT, same updates) |
    sft_oracle, or grpo (UI-R1) | ppo | gigppo (online, dense) at the same sample budget (pipeline/rl_round.py)."""
    learning_rate: float = 5e-6
    """Round 1's learning rate (the least harmful tried with these pairs; 2e-4 wrecked the starting policy's
    grounding turn)."""
    later_learning_rate: float = 0.0
    """Rounds 2.. (0: round 1's; the paper: 1e-6 then a constant 1e-7)."""
    schedule: str = "constant"
    """constant | cosine (over the round's updates), after `warmup_steps` of linear warm-up."""
    warmup_steps: int = 0
    """Linear warm-up updates of a round."""
    lora_rank: int = 0
    """0: full weights; > 0: LoRA adapters (e.g. a 2B/7B model on one GPU)."""
    batch_size: int = 8
    """Packed rows (prefix nodes) per T-DPO step."""
    max_pairs_per_batch: int = 16
    """Pairs per T-DPO step, at most."""
    text_buckets: tuple[int, ...] = (384, 512, 640)
    """Packed row lengths (prefix + continuations)."""
    max_pairs_per_tree: int = 12
    """β pairs per (tree, turn)."""
    max_gamma_pairs_per_tree: int = 0
    """γ pairs per (tree, turn); 0: `max_pairs_per_tree`."""
    # measured: "paper" taught the action turn to contradict its own thought
    gamma_pairs: str = "consistent"
    """γ pairs (golden ↑ vs sampled ↓ in trees without a correct leaf): paper (action turn, grounding) |
    consistent (action-turn pairs only below thoughts naming the golden action) | grounding | none."""
    pair_turns: tuple[int, ...] = (1, 2, 3, 4)
    """CoaT turns that give pairs ((3, 4): action and grounding only, an ablation)."""
    freeze_vision: bool = True
    """Freeze the vision tower in the rounds."""
    early_stop: bool = True
    """Stop after the first round that does not beat the best dev step accuracy."""
    diagnostics: bool = True
    """Measure what each round did (results.json "diagnostics"; costs one more tree sampling and
    greedy decoding of `diagnostic_steps` twice)."""
    diagnostic_steps: int = 16
    """Round steps whose sampled pass@1, greedy accuracy and thought -> action consistency are measured."""
    heldout_steps: int = 16
    """Dev steps whose trees give held-out pairs (preference accuracy, margins; 0: none)."""

    def __post_init__(self):
        from ipl_jax.training.optimizer import SCHEDULES  # imported when made (no JAX on import)

        self.need("method", self.method in METHODS, one_of(METHODS))
        self.need("gamma_pairs", self.gamma_pairs in GAMMA_MODES, one_of(GAMMA_MODES))
        self.need("schedule", self.schedule in SCHEDULES, one_of(SCHEDULES))
        self.need(
            "pair_turns",
            bool(self.pair_turns) and set(self.pair_turns) <= {1, 2, 3, 4},
            "must be a non-empty subset of 1, 2, 3, 4",
        )
        self.need("learning_rate", is_positive(self.learning_rate), "must be > 0")
        for name in ("later_learning_rate", "round_fraction"):
            self.need(name, is_nonneg(getattr(self, name)), "must be >= 0")
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

    # ---------------------------------------------------------------- the library objects a round runs with
    # (their modules are imported when built: importing the settings loads no JAX)

    def optimizer(self, round_index: int, grad_clip: float) -> OptimizerSettings:
        """Round ``round_index``'s optimizer: its learning rate (``lr``), schedule and warm-up; SFT's ``grad_clip``."""
        from ipl_jax.preference.tdpo import IPL_OPTIMIZER

        return dataclasses.replace(
            IPL_OPTIMIZER,
            learning_rate=self.lr(round_index),
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            grad_clip_norm=grad_clip,
        )

    def tdpo(self, model: Qwen2VLConfig, precision: Precision, grad_clip: float, round_index: int = 1) -> TDPOConfig:
        """Round ``round_index``'s T-DPO step on ``model`` (the job's compute dtype and attention) at ``precision``:
        this section's loss and objective (``no_negatives``: SFT on the positives), its optimizer."""
        from ipl_jax.preference.tdpo import TDPOConfig

        return TDPOConfig(
            model=model,
            remat=precision.remat,
            compute_dtype=precision.compute_dtype,
            reference_dtype=precision.storage,
            dpo=self.dpo,
            objective="positive_sft" if self.method == "no_negatives" else "tdpo",
            optimizer_settings=self.optimizer(round_index, grad_clip),
        )

    def round(
        self,
        model: Qwen2VLConfig,
        precision: Precision,
        grad_clip: float,
        sampler: SamplerSettings,
        buckets: BucketSettings,
        pad_id: int,
        round_index: int = 1,
    ) -> RoundConfig:
        """Round ``round_index``: its T-DPO step (``tdpo``), pairs, selection and packing as this section says. A row
        holds one step's prefix with up to ``max(sampler.tree.branching) + 1`` continuations, so its patch slot is one
        screenshot's (``buckets.patches``), as the memory plan assumes."""
        from ipl_jax.preference.packed_batch import PackingConfig
        from ipl_jax.preference.pairs import PairConfig
        from ipl_jax.preference.round import RoundConfig

        packing = PackingConfig(
            rows=self.batch_size,
            max_continuations=max(sampler.tree.branching) + 1,
            max_pairs=self.max_pairs_per_batch,
            text_buckets=self.text_buckets,
            patch_buckets=tuple(buckets.patches),
            pad_id=int(pad_id),
        )
        pairs = PairConfig(
            max_beta_pairs_per_tree_turn=self.max_pairs_per_tree,
            max_gamma_pairs_per_tree_turn=0 if self.gamma_pairs == "none" else self.gamma_cap,
            gamma_action_pairs=self.gamma_pairs in ("paper", "consistent"),
            gamma_grounding_pairs=self.gamma_pairs != "none",
            turns=self.pair_turns,
        )
        return RoundConfig(
            tdpo=self.tdpo(model, precision, grad_clip, round_index),
            packing=packing,
            pairs=pairs,
            pair_mode="naive" if self.method == "naive_dpo" else "tdpo",
            selection=self.selection,
            train_on="golden" if self.method in GOLDEN_METHODS else "pairs",
            gamma_consistent_only=self.gamma_pairs == "consistent",
        )
