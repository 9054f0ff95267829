"""The job's settings: one frozen, typed dataclass per config section, made and checked once; every failure is
one ``SettingsError`` line naming the field. Field meanings: ``configs/synthetic.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from ipl_jax.data.datasets import ALIASES, LOADERS, TFDS_PREFIX, canonical_format
from ipl_jax.data.synthetic.config import SPLITS, WorldConfig

if typing.TYPE_CHECKING:
    from ipl_jax.training.state import Precision

MAX_SEED = 2**32 - 1  # numpy's seed range (the world and the samplers take numpy seeds)
RL_METHODS = ("grpo", "ppo", "gigppo")  # the other seeds' learners (pipeline/rl_round.py)
METHODS = ("tdpo", "naive_dpo", "no_negatives", "continued_sft", "sft_oracle", *RL_METHODS)
GOLDEN_METHODS = ("continued_sft", "sft_oracle")  # supervised training on golden CoaT at the round's update budget
GAMMA_MODES = ("paper", "consistent", "grounding", "none")
# The names a library accepts are the library's own (preference.losses.LOSS_KINDS, training.optimizer.SCHEDULES,
# ...): a section imports them when it is made, so that importing this module loads no JAX (commands start fast).


class SettingsError(ValueError):
    """A job setting that cannot be used; the message is one line naming the field and what to do."""


def setting_error(field: str, value: Any, why: str) -> SettingsError:
    """``config.<field>=<value>: <why> (fix it with --config.<field>=...)``."""
    return SettingsError(f"config.{field}={value!r}: {why} (fix it with --config.{field}=...)")


def _nonneg(v) -> bool:
    return math.isfinite(v) and v >= 0


def _positive(v) -> bool:
    return math.isfinite(v) and v > 0


def _one_of(choices) -> str:
    return f"must be one of {', '.join(choices)}"


# ---------------------------------------------------------------------------------------------- typed values


def _typed(hint, value, field: str):
    """``value`` as the annotated type ``hint`` (bool, int, float, str, tuples of them, dataclasses)."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _section(hint, value, field)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise setting_error(field, value, "must be true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise setting_error(field, value, "must be an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise setting_error(field, value, "must be a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise setting_error(field, value, "must be a string")
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (tuple, list)):
            raise setting_error(field, value, "must be a tuple")
        if args[-1] is Ellipsis:
            return tuple(_typed(args[0], v, field) for v in value)
        if len(value) != len(args):
            raise setting_error(field, tuple(value), f"must be {len(args)} values")
        return tuple(_typed(a, v, field) for a, v in zip(args, value))
    raise TypeError(f"{field}: no conversion for {hint}")


def _section(cls, values, field: str):
    """A dataclass from a mapping of its fields (every field given, none unknown), each value typed."""
    where = f"config.{field}" if field else "the config"
    if not isinstance(values, Mapping):
        raise SettingsError(f"{where}: expected a section, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown, missing = sorted(set(values) - set(names)), [n for n in names if n not in values]
    if unknown:
        raise SettingsError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(names)})")
    if missing and issubclass(cls, Section):
        raise SettingsError(f"{where}: missing field(s) {', '.join(missing)}")
    prefix = f"{field}." if field else ""
    typed = {n: _typed(hints[n], values[n], prefix + n) for n in names if n in values}
    try:
        return cls(**typed)
    except SettingsError:
        raise
    except ValueError as e:  # a library dataclass's own check (WorldConfig)
        raise SettingsError(f"{where}: {e}") from None


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section: ``PATH`` is its dotted name; ``need`` raises the one-line error of a field."""

    PATH: ClassVar[str] = ""

    def need(self, name: str, ok: bool, why: str) -> None:
        if not ok:
            raise setting_error(f"{self.PATH}.{name}" if self.PATH else name, getattr(self, name), why)

    def at_least(self, names: str, low: int, note: str = "") -> None:
        for name in names.split():
            self.need(name, getattr(self, name) >= low, f"must be >= {low}{note}")


# ------------------------------------------------------------------------------------------------- sections


@dataclasses.dataclass(frozen=True)
class DataSettings(Section):
    PATH: ClassVar[str] = "data"
    format: str
    root: str
    train_episodes: int
    dev_episodes: int
    test_episodes: int
    test_splits: tuple[str, ...]
    dev_split: str
    dev_holdout: int
    png_level: int
    loader_threads: int
    store: str
    shards: int
    skip_bad: bool
    coat_fallback: bool
    annotated_episodes: int
    action_episodes: int
    action_root: str
    action_format: str

    def __post_init__(self):
        known = self.format == "synthetic" or self.format in LOADERS or self.format.startswith(TFDS_PREFIX)
        self.need("format", known, f"must be one of synthetic, {', '.join(LOADERS)} or {TFDS_PREFIX}NAME")
        self.at_least("train_episodes test_episodes", 1)
        self.at_least("dev_episodes", 0)
        self.need("png_level", 0 <= self.png_level <= 9, "must be a PNG compression level 0..9")
        self.need("test_splits", len(self.test_splits) >= 1, "must name at least one test split")
        self.need("store", self.store in ("aitz", "arrayrecord"), "must be aitz or arrayrecord")
        self.at_least("shards", 1)
        self.at_least("annotated_episodes action_episodes", 0)
        n, m = self.annotated_episodes, self.action_episodes
        logs = canonical_format(self.action_format)
        self.need(
            "action_format",
            not logs or logs in LOADERS or logs.startswith(TFDS_PREFIX),
            f"must be a format holding golden actions: {', '.join([*LOADERS, *ALIASES])} or {TFDS_PREFIX}NAME",
        )
        self.need(
            "action_format", not logs or self.action_root, "has no data.action_root to read (set both, or neither)"
        )
        if m > 0 and not self.action_root:
            self.need(
                "annotated_episodes",
                n >= 1,
                f"leaves no annotated episode for warm-up SFT beside the {m} action-only ones",
            )
        pool = self.train_episodes - (0 if self.dev_split else self.dev_holdout)
        if self.synthetic and self.action_root:
            self.need("annotated_episodes", n <= pool, f"exceeds the world's {pool} training episodes")
        elif self.synthetic and m > 0:
            self.need(
                "action_episodes",
                n + m <= pool,
                f"with {n} annotated episodes exceeds the {pool} training episodes (raise data.train_episodes)",
            )

    @property
    def scarce(self) -> bool:
        """Scarce annotations: ``action_episodes`` training episodes, or those of ``action_root``, are action logs."""
        return self.action_episodes > 0 or bool(self.action_root)

    @property
    def log_format(self) -> str:
        """The format ``action_root`` is read in: ``action_format``, else ``format`` (synthetic: aitz)."""
        return canonical_format(self.action_format or ("aitz" if self.synthetic else self.format))

    @property
    def synthetic(self) -> bool:
        return self.format == "synthetic"

    @property
    def dev_name(self) -> str:
        """The dev split's name (``dev`` when it is held out of the training split)."""
        return self.dev_split or "dev"

    def split_names(self) -> list[str]:
        """Every split the job reads: train, dev (when the data has one) and the test splits, once each."""
        return list(dict.fromkeys(["train"] + ([self.dev_split] if self.dev_split else []) + list(self.test_splits)))

    def episodes_for(self, split: str) -> int:
        """The episodes a synthetic split holds."""
        if split == "train":
            return self.train_episodes
        return self.dev_episodes if split == self.dev_split else self.test_episodes


@dataclasses.dataclass(frozen=True)
class EvolutionSettings(Section):
    PATH: ClassVar[str] = "evolution"
    enabled: bool
    levels: tuple[int, ...]
    per_step: int
    max_items: int
    screens: str

    def __post_init__(self):
        self.need("levels", bool(self.levels) and set(self.levels) <= {1, 2, 3}, "must be a subset of 1, 2, 3")
        self.at_least("per_step max_items", 0)
        self.need("screens", self.screens in ("all", "annotated"), "must be all or annotated")


@dataclasses.dataclass(frozen=True)
class ModelSettings(Section):
    PATH: ClassVar[str] = "model"
    checkpoint: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vision_depth: int
    vision_embed_dim: int
    vision_num_heads: int
    tie_word_embeddings: bool
    dtype: str
    param_dtype: str
    attention: str
    remat: str
    min_pixels: int
    max_pixels: int

    def __post_init__(self):
        from ipl_jax.model.config import DTYPES  # see the names above
        from ipl_jax.model.layers import ATTENTION_IMPLS, REMAT_POLICIES

        for name in ("dtype", "param_dtype"):
            self.need(name, getattr(self, name) in ("auto", *DTYPES), f"unknown (valid: auto, {', '.join(DTYPES)})")
        self.need("attention", self.attention in ATTENTION_IMPLS, _one_of(ATTENTION_IMPLS))
        self.need(
            "attention",
            self.attention != "cudnn" or self.dtype in ("auto", "bfloat16", "float16"),
            f"cuDNN attention needs model.dtype bfloat16 or float16, not {self.dtype} (or use auto)",
        )
        self.need("remat", self.remat in REMAT_POLICIES, _one_of(REMAT_POLICIES))
        self.at_least("min_pixels", 1)
        self.need("max_pixels", self.max_pixels >= self.min_pixels, "must be >= model.min_pixels")

    def precision(self) -> Precision:
        """'auto' compute is the checkpoint's declared dtype (float32 for a fresh model); 'auto' storage the compute
        dtype."""
        from ipl_jax.model.config import checkpoint_dtype  # see the names above
        from ipl_jax.training.state import Precision

        compute = self.dtype
        if compute == "auto":
            has_config = self.checkpoint and os.path.isfile(os.path.join(self.checkpoint, "config.json"))
            compute = checkpoint_dtype(self.checkpoint) if has_config else "float32"
        return Precision(compute, compute if self.param_dtype == "auto" else self.param_dtype, self.remat)

    def check_platform(self, platform: str) -> None:
        """The dtypes, attention and remat policy run on ``platform``."""
        from ipl_jax.model.config import BACKEND_DTYPES, DTYPES  # see the names above
        from ipl_jax.model.layers import check_remat

        valid = ("auto", *BACKEND_DTYPES.get(platform, DTYPES))
        for name in ("dtype", "param_dtype"):
            self.need(name, getattr(self, name) in valid, f"not available on {platform} (valid: {', '.join(valid)})")
        self.need(
            "attention",
            self.attention != "cudnn" or platform == "gpu",
            f"cuDNN attention needs a GPU, this backend is {platform} (valid here: auto, reference, xla)",
        )
        try:
            check_remat(self.remat, platform, "config.model.remat")
        except ValueError as e:
            raise SettingsError(f"{e} (fix it with --config.model.remat=...)") from None


@dataclasses.dataclass(frozen=True)
class BucketSettings(Section):
    """tokens: SFT row lengths; patches: patches per screenshot; max_turn_tokens: each CoaT turn's budget (end token
    included); fixed: data over a largest bucket stops the job instead of adding a bucket."""

    PATH: ClassVar[str] = "buckets"
    tokens: tuple[int, ...]
    patches: tuple[int, ...]
    max_turn_tokens: tuple[int, int, int, int]
    fixed: bool = False

    def __post_init__(self):
        for name in ("tokens", "patches", "max_turn_tokens"):
            values = getattr(self, name)
            self.need(name, bool(values) and min(values) >= 1, "must be one or more sizes >= 1")

    @property
    def image_patches(self) -> int:
        """One screenshot's patch slot: the largest patch bucket."""
        return max(self.patches)

    def patch_buckets(self, images: int) -> tuple[int, ...]:
        """Patch buckets of a batch of ``images`` screenshots (the per-image buckets x images)."""
        return tuple(p * images for p in self.patches)


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


@dataclasses.dataclass(frozen=True)
class GRPOSettings(Section):
    """UI-R1's GRPO (docs/method.md §11): G completions per prompt, the clipped objective, the k3 KL."""

    PATH: ClassVar[str] = "rl.grpo"
    group_size: int
    style: str
    clip_eps: float
    kl_beta: float
    learning_rate: float
    dast: bool
    prompts_per_batch: int
    updates_per_batch: int
    length_norm: str

    def __post_init__(self):
        from ipl_jax.rl.common import GRPO_STYLES, LENGTH_NORMS  # see the names above

        self.at_least("group_size prompts_per_batch updates_per_batch", 1)
        self.need("style", self.style in GRPO_STYLES, _one_of(GRPO_STYLES))
        self.need("length_norm", self.length_norm in LENGTH_NORMS, "must be sequence or token")
        for name in ("clip_eps", "learning_rate"):
            self.need(name, _positive(getattr(self, name)), "must be > 0")
        self.need("kl_beta", _nonneg(self.kl_beta), "must be >= 0")


@dataclasses.dataclass(frozen=True)
class PPOSettings(Section):
    """Online PPO / GiGPPO with dense rewards in the live world (docs/method.md §11)."""

    PATH: ClassVar[str] = "rl.ppo"
    gamma_dense: float
    lam: float
    kl_coef: float
    value_clip: float
    critic_warmup: int
    policy_updates: int
    policy_learning_rate: float
    critic_learning_rate: float
    tasks_per_batch: int
    trajectories_per_task: int
    minibatch_rows: int
    success_reward: float
    step_reward: str
    max_steps: int
    step_factor: float

    def __post_init__(self):
        from ipl_jax.rl.rollout import STEP_REWARDS  # see the names above

        for name in ("gamma_dense", "lam"):
            self.need(name, _nonneg(getattr(self, name)) and getattr(self, name) <= 1, "must be in [0, 1]")
        for name in ("kl_coef", "success_reward"):
            self.need(name, _nonneg(getattr(self, name)), "must be >= 0")
        for name in ("value_clip", "policy_learning_rate", "critic_learning_rate", "step_factor"):
            self.need(name, _positive(getattr(self, name)), "must be > 0")
        self.at_least("critic_warmup", 0)
        self.at_least("policy_updates tasks_per_batch trajectories_per_task minibatch_rows max_steps", 1)
        self.need("step_reward", self.step_reward in STEP_REWARDS, _one_of(STEP_REWARDS))

    @property
    def worlds(self) -> int:
        """Live worlds per rollout batch."""
        return self.tasks_per_batch * self.trajectories_per_task


@dataclasses.dataclass(frozen=True)
class RLSettings(Section):
    PATH: ClassVar[str] = "rl"
    grpo: GRPOSettings
    ppo: PPOSettings
    row_buckets: tuple[int, ...]

    def __post_init__(self):
        self.need(
            "row_buckets",
            bool(self.row_buckets) and min(self.row_buckets) >= 1,
            "must be one or more lengths >= 1 (training rows: prompt + sampled CoaT)",
        )


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


@dataclasses.dataclass(frozen=True)
class MeshSettings(Section):
    """Axis sizes of the ('data', 'fsdp', 'tensor') mesh; -1: every remaining device."""

    PATH: ClassVar[str] = "mesh"
    data: int
    fsdp: int
    tensor: int

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
            raise SettingsError(
                f"config.mesh (data, fsdp, tensor) = {sizes}: sizes must be >= 1, with at most one -1 (all "
                "remaining devices)"
            )

    def shape(self, n_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) on ``n_devices``."""
        shape = [self.data, self.fsdp, self.tensor]
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = n_devices // known if n_devices % known == 0 else 0
        if math.prod(shape) != n_devices:
            raise SettingsError(
                f"config.mesh (data, fsdp, tensor) = ({self.data}, {self.fsdp}, {self.tensor}) does not fit "
                f"{n_devices} devices; set --config.mesh.data etc. so that their product is {n_devices}"
            )
        return tuple(shape)

    def batch_ways(self, n_devices: int) -> int:
        """How many ways the mesh splits a batch: its data x fsdp axes on ``n_devices``."""
        data, fsdp, _ = self.shape(n_devices)
        return data * fsdp


# ------------------------------------------------------------------------------------------------- the job


@dataclasses.dataclass(frozen=True)
class Settings(Section):
    """Every section of a job config (``configs/synthetic.py`` documents each field)."""

    seed: int
    data: DataSettings
    world: WorldConfig
    evolution: EvolutionSettings
    model: ModelSettings
    buckets: BucketSettings
    sft: SFTSettings
    seed_selection: SeedSelectionSettings
    sampler: SamplerSettings
    reward: RewardSettings
    ipl: IPLSettings
    rl: RLSettings
    eval: EvalSettings
    export: ExportSettings
    ablation: AblationSettings
    mesh: MeshSettings

    def __post_init__(self):
        self.need("seed", 0 <= self.seed <= MAX_SEED, f"must be an integer in [0, {MAX_SEED}]")
        fmt = self.data.format
        if self.eval.online_episodes > 0 and not self.data.synthetic:
            raise SettingsError(
                f"config.eval.online_episodes={self.eval.online_episodes}: online evaluation plays the synthetic "
                f"world, but config.data.format is {fmt!r} (fix it with --config.eval.online_episodes=0)"
            )
        method = self.ipl.method
        if method == "sft_oracle" and not self.data.scarce:
            raise setting_error(
                "ipl.method",
                method,
                "trains on the CoaT of action-only episodes, and data.action_episodes is 0 (without them "
                "continued_sft already trains on the golden CoaT of the round's steps)",
            )
        if method in ("ppo", "gigppo") and not self.data.synthetic:
            raise setting_error("data.format", fmt, f"must be synthetic with ipl.method={method} (online)")
        if method == "gigppo" and self.rl.ppo.trajectories_per_task < 2:
            raise setting_error(
                "rl.ppo.trajectories_per_task",
                self.rl.ppo.trajectories_per_task,
                "must be >= 2 with gigppo (sibling states)",
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Settings:
        """Settings from a job config as nested dicts (a config file's sections); raises ``SettingsError``."""
        return _section(cls, values, "")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, values: Mapping[str, Any]) -> Settings:
        """These settings with ``{"section.field": value}`` changed (deeper paths too), checked again."""
        out = self.to_dict()
        for dotted, value in values.items():
            *parents, leaf = dotted.split(".")
            node = out
            for part in parents:
                node = node[part]
            if leaf not in node:
                raise SettingsError(f"config.{dotted}: no such field")
            node[leaf] = value
        return Settings.from_dict(out)

    def check_machine(self, platform: str, n_devices: int) -> None:
        """What depends on the machine: dtypes / attention / remat on ``platform``; with several devices, the mesh and
        the batches it splits."""
        self.model.check_platform(platform)
        if n_devices <= 1:
            return  # one device: the job runs without a mesh
        ways = self.mesh.batch_ways(n_devices)
        micro = "sft.micro_batch_size" if self.sft.micro_batch_size else "sft.batch_size"
        for field, size in (
            (micro, self.sft.micro),
            ("sampler.batch_size", self.sampler.batch_size),
            ("ipl.batch_size", self.ipl.batch_size),
            ("eval.batch_size", self.eval.batch_size),
        ):
            if size % ways:
                raise SettingsError(
                    f"config.{field}={size}: not divisible by the mesh's batch axes (data x fsdp = {ways} on "
                    f"{n_devices} devices), so every device would hold the whole batch; use a multiple of {ways}"
                )
