"""Warm-up SFT (``sft``), the starting policy's selection (``start_selection``), CoaT-tree sampling (``sampler``)
and the leaf reward (``reward``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import ClassVar

from ipl_jax.coat.sections import LeafRewardShares
from ipl_jax.sampling.sections import TreeSampling
from ipl_jax.sections import Section, is_nonneg, is_positive, one_of

if typing.TYPE_CHECKING:
    from ipl_jax.coat.rewards import RewardConfig
    from ipl_jax.sampling.config import SamplerConfig
    from ipl_jax.settings.model import BucketSettings
    from ipl_jax.training.optimizer import OptimizerSettings


@dataclasses.dataclass(frozen=True)
class SFTSettings(Section):
    PATH: ClassVar[str] = "sft"
    steps: int = 900
    """Warm-up SFT updates."""
    batch_size: int = 8
    """Dialogues per update."""
    micro_batch_size: int = 4
    """Dialogues per micro-batch (gradient accumulation; the ViT attends over a whole one); 0: none."""
    learning_rate: float = 2e-3
    """Peak learning rate."""
    warmup_steps: int = 30
    """Linear warm-up updates."""
    schedule: str = "cosine"
    """cosine | constant, after the warm-up."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient global-norm clip (0: none)."""
    checkpoint_every: int = 100
    """Updates between checkpoints."""
    start_candidates: int = 2
    """Checkpoints (the last N saved) scored to choose the starting policy."""
    freeze_vision: bool = False
    """Freeze the vision tower (the paper trains it during warm-up SFT)."""
    lora_rank: int = 0
    """0: full fine-tuning; > 0: LoRA adapters of this rank (alpha = 2 x rank)."""
    reading_episodes: int = 0
    """Synthetic data only: warm-up SFT also trains on the reading chats (``pretrain.*`` questions) of this many
    episodes of the pretraining stream, mixed in with the CoaT items, so that a reading base keeps reading."""

    def __post_init__(self):
        from ipl_jax.training.optimizer import SCHEDULES  # imported when made (no JAX on import)

        self.at_least("steps warmup_steps lora_rank reading_episodes", 0)
        self.at_least("batch_size checkpoint_every start_candidates", 1)
        self.at_least("micro_batch_size", 0, " (0: no micro-batches)")
        self.need("micro_batch_size", self.batch_size % self.micro == 0, "must divide sft.batch_size")
        self.need("learning_rate", is_positive(self.learning_rate), "must be > 0")
        self.need("weight_decay", is_nonneg(self.weight_decay), "must be >= 0")
        self.need("grad_clip", is_nonneg(self.grad_clip), "must be >= 0 (0: no clipping)")
        self.need("schedule", self.schedule in SCHEDULES, one_of(SCHEDULES))

    @property
    def micro(self) -> int:
        """Dialogues per micro-batch (gradients accumulated over ``batch_size / micro`` of them)."""
        return self.micro_batch_size or self.batch_size

    def optimizer(self) -> OptimizerSettings:
        """Warm-up SFT's optimizer: learning rate, schedule over ``steps``, warm-up, decay, clipping."""
        from ipl_jax.training.optimizer import OptimizerSettings  # imported when built (no JAX on import)

        return OptimizerSettings(
            learning_rate=self.learning_rate,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip,
        )


@dataclasses.dataclass(frozen=True)
class StartSelectionSettings(Section):
    """How the starting policy of the IPL rounds is chosen among the SFT candidates (docs/method.md §9)."""

    PATH: ClassVar[str] = "start_selection"
    steps: int = 24
    """Training steps whose trees score each candidate."""
    diversity_weight: float = 0.1
    """w of score = Acc_S + w * Div_R / max over the candidates of Div_R."""
    embedder: str = "auto"
    """auto (MiniLM when installed, else TF-IDF) | minilm | tfidf."""

    def __post_init__(self):
        from ipl_jax.eval.embeddings import EMBEDDERS  # imported when made (no JAX on import)

        self.at_least("steps", 1)
        self.need("diversity_weight", is_nonneg(self.diversity_weight), "must be >= 0")
        self.need("embedder", self.embedder in EMBEDDERS, one_of(EMBEDDERS))


@dataclasses.dataclass(frozen=True)
class SamplerSettings(Section):
    """The job's sampler: the tree's shape, token filter and prompt buckets (``tree``: the tree sampler's own section),
    one temperature and the trees per call."""

    PATH: ClassVar[str] = "sampler"
    tree: TreeSampling = dataclasses.field(default_factory=TreeSampling)
    """branching, top_k, top_p, prefix_buckets, prompt_buckets (sampling/sections.py)."""
    temperature: float = 1.0
    """Sampling temperature."""
    batch_size: int = 4
    """Trees per jitted call (4 x 27 leaves)."""

    def __post_init__(self):
        self.need("temperature", is_nonneg(self.temperature), "must be >= 0")
        self.at_least("batch_size", 1)

    def build(
        self,
        ids,
        buckets: BucketSettings,
        eval_batch_size: int,
        *,
        greedy: bool = False,
        branching: Sequence[int] | None = None,
    ) -> SamplerConfig:
        """The job's ``SamplerConfig``: this section's tree (its branching, or ``branching``), temperature (the
        grounding turn greedy); ``buckets``' turn budgets and patch buckets for a sampler batch
        and an evaluation batch of ``eval_batch_size``. ``ids``: the tokenizer's ``SpecialIds`` (its ``eos``, ``pad``
        and vision placeholders are read; ``plan``, without a tokenizer, passes a checkpoint config's). ``greedy``:
        every turn greedy."""
        from ipl_jax.sampling.config import SamplerConfig, greedy_config  # imported when built (no JAX on import)

        tree = self.tree if branching is None else dataclasses.replace(self.tree, branching=tuple(branching))
        t = self.temperature
        config = SamplerConfig(
            **dataclasses.asdict(tree),
            max_turn_tokens=buckets.max_turn_tokens,
            temperature=(t, t, t, 0.0),
            eos_ids=tuple(ids.eos),
            pad_id=int(ids.pad),
            # the vision placeholders never belong in a reply (a re-encoded dialogue would read them as an image)
            suppress_ids=(int(ids.image_pad), int(ids.video_pad), int(ids.vision_start), int(ids.vision_end)),
            patch_buckets=buckets.patch_buckets(self.batch_size) + buckets.patch_buckets(eval_batch_size),
            image_patches=buckets.image_patches,
        )
        return greedy_config(config) if greedy else config


@dataclasses.dataclass(frozen=True)
class RewardSettings(Section):
    """The leaf reward (docs/method.md §4: its ``shares``, the reward kernels' own section) and the value backup
    (§5)."""

    PATH: ClassVar[str] = "reward"
    shares: LeafRewardShares = dataclasses.field(default_factory=LeafRewardShares)
    """v_type, v_format: the reward of a right type and of a well-formed answer (coat/sections.py)."""
    discount: float = 0.95
    """c of the value backup (docs/method.md §5)."""

    def __post_init__(self):
        self.need("discount", is_positive(self.discount) and self.discount <= 1, "must be in (0, 1]")

    def build(self, rules: str) -> RewardConfig:
        """The leaf reward: this section's shares, exact match by the rule set ``rules`` (``DataSettings.rules``)."""
        from ipl_jax.coat.rewards import RewardConfig  # imported when built (no JAX on import)

        return RewardConfig(**dataclasses.asdict(self.shares), rules=rules)


@dataclasses.dataclass(frozen=True)
class PretrainSettings(Section):
    """``ipl-jax pretrain``: the screens a base model learns to read (its updates, batch and rate are the ``sft``
    section's; the model's size and resolution the ``model`` section's)."""

    PATH: ClassVar[str] = "pretrain"
    episodes: int = 600
    """Episodes of the training split's world whose screens are read (every step's screen, about 4 each)."""
    eval_episodes: int = 24
    """Held-out episodes (the same stream, after the training ones) whose screens measure reading."""
    where: int = 3
    """'Where is X?' questions per screen."""
    what: int = 3
    """'What is at (x, y)?' questions per screen."""
    max_texts: int = 24
    """Texts listed in the answer to 'read the texts'."""
    task: bool = False
    """Also ask, per screen, which screen text the episode's instruction names and what it says to type."""

    def __post_init__(self):
        self.at_least("episodes eval_episodes", 1)
        self.at_least("where what max_texts", 0)
