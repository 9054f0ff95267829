"""The job's ``ipl`` section read once into typed settings, and the round's configs built from them."""

from __future__ import annotations

import dataclasses

import ml_collections

RL_METHODS = ("grpo", "ppo", "gigppo")  # the other seeds' learners (pipeline/rl_round.py)
METHODS = ("tdpo", "naive_dpo", "no_negatives", "continued_sft", "sft_oracle", *RL_METHODS)
GOLDEN_METHODS = ("continued_sft", "sft_oracle")  # supervised training on golden CoaT at the round's update budget
GAMMA_MODES = ("paper", "consistent", "grounding", "none")


@dataclasses.dataclass(frozen=True)
class IPLSettings:
    """The job's ``ipl`` section, typed and checked once (``ipl_settings``); every field is documented in
    ``configs/synthetic.py``."""

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
    text_buckets: tuple
    max_pairs_per_tree: int
    max_gamma_pairs_per_tree: int
    gamma_pairs: str
    pair_turns: tuple
    dedup: bool
    type_balance: float
    mix_trees: bool
    freeze_vision: bool
    early_stop: bool
    diagnostics: bool
    diagnostic_steps: int
    heldout_steps: int

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"config.ipl.{field}: {why} (got {getattr(self, field)!r})")

        if self.method not in METHODS:
            bad("method", f"must be one of {', '.join(METHODS)}")
        if self.gamma_pairs not in GAMMA_MODES:
            bad("gamma_pairs", f"must be one of {', '.join(GAMMA_MODES)}")
        if self.sft_norm not in ("token", "sum"):
            bad("sft_norm", "must be token or sum")
        if not self.pair_turns or not set(self.pair_turns) <= {1, 2, 3, 4}:
            bad("pair_turns", "must be a non-empty subset of 1, 2, 3, 4")
        if self.schedule not in ("constant", "cosine"):
            bad("schedule", "must be constant or cosine")
        for f in ("learning_rate", "beta"):
            if not getattr(self, f) > 0:
                bad(f, "must be > 0")
        for f in ("later_learning_rate", "sft_weight", "type_balance", "round_fraction"):
            if getattr(self, f) < 0:
                bad(f, "must be >= 0")
        for f in ("rounds", "batch_size", "max_pairs_per_batch", "diagnostic_steps"):
            if getattr(self, f) < 1:
                bad(f, "must be >= 1")
        for f in (
            "warmup_steps",
            "steps_per_round",
            "max_pairs_per_tree",
            "max_gamma_pairs_per_tree",
            "lora_rank",
            "heldout_steps",
        ):
            if getattr(self, f) < 0:
                bad(f, "must be >= 0")

    @property
    def gamma_cap(self) -> int:
        return self.max_gamma_pairs_per_tree if self.max_gamma_pairs_per_tree > 0 else self.max_pairs_per_tree

    def lr(self, round_index: int) -> float:
        """Round 1's learning rate, or ``later_learning_rate`` for later rounds when it is set."""
        return self.learning_rate if round_index <= 1 or self.later_learning_rate <= 0 else self.later_learning_rate


def ipl_settings(config: ml_collections.ConfigDict) -> IPLSettings:
    """The ``ipl`` section as ``IPLSettings`` (raises ValueError naming a bad field)."""
    c = config.ipl
    kinds = {f.name: f.type for f in dataclasses.fields(IPLSettings)}
    values = {}
    for name, kind in kinds.items():
        v = c[name]
        if kind == "tuple":
            values[name] = tuple(int(x) for x in v)
        elif kind == "bool":
            values[name] = bool(v)
        else:
            values[name] = {"int": int, "float": float, "str": str}[kind](v)
    return IPLSettings(**values)


def ipl_optimizer(config: ml_collections.ConfigDict, round_index: int = 1):
    """The ``ipl`` section's ``OptimizerSettings`` for a round: read by ``training.optimizer.optimizer_settings``
    (learning rate, schedule, warm-up), with ``later_learning_rate`` from round 2 when set and the SFT section's
    gradient clipping."""
    from ipl_jax.preference.tdpo import IPL_OPTIMIZER
    from ipl_jax.training.optimizer import optimizer_settings, settings_dict

    settings = optimizer_settings({**settings_dict(IPL_OPTIMIZER), **config.ipl})
    return dataclasses.replace(
        settings,
        learning_rate=ipl_settings(config).lr(round_index),
        grad_clip_norm=optimizer_settings(config.sft).grad_clip_norm,
    )


def tdpo_config(config: ml_collections.ConfigDict, cfg, round_index: int = 1):
    from ipl_jax.pipeline.model_stage import job_model_config, job_train_precision
    from ipl_jax.preference.losses import DPOConfig
    from ipl_jax.preference.tdpo import TDPOConfig

    s = ipl_settings(config)
    precision = job_train_precision(config)
    return TDPOConfig(
        model=job_model_config(config, cfg),
        remat=precision["remat"],
        compute_dtype=precision["compute_dtype"],
        reference_dtype=precision["storage_dtype"],
        dpo=DPOConfig(beta=s.beta, sft_weight=s.sft_weight, kind=s.loss_kind, sft_norm=s.sft_norm),
        objective="positive_sft" if s.method == "no_negatives" else "tdpo",
        optimizer_settings=ipl_optimizer(config, round_index),
    )


def round_config(config: ml_collections.ConfigDict, cfg, tokenizer, round_index: int = 1):
    """The ``preference.round.RoundConfig`` of a round."""
    from ipl_jax.preference.packed_batch import PackingConfig
    from ipl_jax.preference.pairs import PairConfig
    from ipl_jax.preference.round import RoundConfig
    from ipl_jax.preference.selection import SelectionConfig

    s = ipl_settings(config)
    k = max(int(b) for b in config.sampler.branching)
    packing = PackingConfig(
        rows=s.batch_size,
        max_continuations=k + 1,
        max_pairs=s.max_pairs_per_batch,
        text_buckets=s.text_buckets,
        patch_buckets=tuple(int(p) * s.batch_size for p in config.buckets.patches),
        pad_id=int(tokenizer.ids.pad),
    )
    pairs = PairConfig(
        max_beta_pairs_per_tree_turn=s.max_pairs_per_tree,
        max_gamma_pairs_per_tree_turn=0 if s.gamma_pairs == "none" else s.gamma_cap,
        gamma_action_pairs=s.gamma_pairs in ("paper", "consistent"),
        gamma_grounding_pairs=s.gamma_pairs != "none",
        turns=s.pair_turns,
    )
    tdpo = tdpo_config(config, cfg, round_index)
    return RoundConfig(
        tdpo=tdpo,
        packing=packing,
        pairs=pairs,
        pair_mode="naive" if s.method == "naive_dpo" else "tdpo",
        selection=SelectionConfig(dedup=s.dedup, type_balance=s.type_balance, mix_trees=s.mix_trees),
        train_on="golden" if s.method in GOLDEN_METHODS else "pairs",
        gamma_consistent_only=s.gamma_pairs == "consistent",
    )
