"""The sampler's settings for one batch: one frozen dataclass (``sections.TreeSampling``'s fields with the batch's turn
budgets, temperatures and ids), a static argument of the jitted tree sampler. A turn cut at its budget is
``finished`` False; temperature 0 is greedy (traced); top-k / top-p follow the temperature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ipl_jax.coat.tree import NUM_TURNS
from ipl_jax.model.inputs import DEFAULT_PATCH_BUCKETS, DEFAULT_TEXT_BUCKETS, pick_bucket
from ipl_jax.sampling.sections import TreeSampling

DEFAULT_TURN_TOKENS = (256, 128, 32, 32)
DEFAULT_TEMPERATURE = (1.0, 1.0, 1.0, 0.0)
DEFAULT_PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024)
# buckets for any checkpoint's screenshots (the declared defaults are the synthetic job's): the CLIs' choice
WIDE_BUCKETS = {"prefix_buckets": DEFAULT_TEXT_BUCKETS, "prompt_buckets": DEFAULT_PROMPT_BUCKETS}


def _per_turn(value, name: str, cast) -> tuple:
    """A scalar or a 4-sequence -> a 4-tuple."""
    if isinstance(value, (int, float)):
        return (cast(value),) * NUM_TURNS
    out = tuple(cast(v) for v in value)
    if len(out) != NUM_TURNS:
        raise ValueError(f"SamplerConfig.{name} must be a scalar or {NUM_TURNS} values, got {tuple(value)}")
    return out


@dataclasses.dataclass(frozen=True)
class SamplerConfig(TreeSampling):
    """How one batch of CoaT-trees is sampled (hashable): ``TreeSampling``'s shape, token filter and prompt buckets,
    per-turn budgets and temperatures, and the ids. eos_ids: ``<|im_end|>`` first; suppress_ids: never drawn (stored
    log-probs unaffected); early_exit: stop a turn once every row finished (same results).
    """

    max_turn_tokens: tuple[int, int, int, int] = DEFAULT_TURN_TOKENS
    temperature: tuple[float, float, float, float] = DEFAULT_TEMPERATURE
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    suppress_ids: tuple[int, ...] = ()
    patch_buckets: tuple[int, ...] = DEFAULT_PATCH_BUCKETS
    early_exit: bool = True
    # > 0: each tree's screenshot padded to this many patches in its own slot and encoded alone (the tower's cost
    # linear in the trees of a batch); 0: all screenshots packed on one patch axis of a ``patch_buckets`` size
    image_patches: int = 0

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)
        set_("branching", tuple(int(k) for k in self.branching))
        for name in ("prefix_buckets", "prompt_buckets", "patch_buckets"):
            set_(name, tuple(sorted(int(x) for x in getattr(self, name))))
        TreeSampling.__post_init__(self)  # the checks of the fields declared with the job's sampler section
        set_("max_turn_tokens", _per_turn(self.max_turn_tokens, "max_turn_tokens", int))
        set_("temperature", _per_turn(self.temperature, "temperature", float))
        set_("eos_ids", tuple(int(e) for e in self.eos_ids))
        set_("suppress_ids", tuple(sorted({int(e) for e in self.suppress_ids})))
        if set(self.eos_ids) & set(self.suppress_ids):
            raise ValueError(f"SamplerConfig: eos ids {self.eos_ids} are also in suppress_ids {self.suppress_ids}")
        if not self.patch_buckets or self.patch_buckets[0] < 1:
            raise ValueError(f"SamplerConfig.patch_buckets must hold positive ints, got {self.patch_buckets}")
        if any(t < 1 for t in self.max_turn_tokens):
            raise ValueError(f"SamplerConfig.max_turn_tokens must be >= 1, got {self.max_turn_tokens}")
        if any(t < 0 for t in self.temperature):
            raise ValueError(f"SamplerConfig.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not self.eos_ids:
            raise ValueError("SamplerConfig.eos_ids is empty: give the end-of-turn id(s) (<|im_end|> first)")

    def replace(self, **kw) -> SamplerConfig:
        return dataclasses.replace(self, **kw)

    def with_patch_buckets(self, extra: Sequence[int]) -> SamplerConfig:
        """This config with the patch buckets ``extra`` added (e.g. for a batch of more screenshots)."""
        return self.replace(patch_buckets=tuple(sorted(set(self.patch_buckets) | set(extra))))

    @staticmethod
    def for_tokenizer(tokenizer, **kw) -> SamplerConfig:
        """A config with a ``QwenTokenizer``'s eos, pad and suppressed placeholder ids filled in; ``kw``: other
        fields."""
        ids = tokenizer.ids
        kw.setdefault("eos_ids", tuple(ids.eos))
        kw.setdefault("pad_id", int(ids.pad))
        kw.setdefault("suppress_ids", (int(ids.image_pad), int(ids.video_pad)))
        return SamplerConfig(**kw)

    @property
    def greedy(self) -> bool:
        return all(t == 0 for t in self.temperature)

    def compile_key(self) -> SamplerConfig:
        """This config with the temperatures blanked (they are traced, so such configs share one compilation)."""
        return dataclasses.replace(self, temperature=(1.0,) * NUM_TURNS)

    def cache_size(self, prefix_len: int, prompt_lens: Sequence[int], upto_turn: int | None = None) -> int:
        """KV slots a row needs through turn ``upto_turn`` (default 4): prefix + Σ (prompt + turn budget).
        prompt_lens: the bucketed turn-2, -3, -4 prompt lengths.
        """
        upto = NUM_TURNS if upto_turn is None else int(upto_turn)
        size = int(prefix_len) + self.max_turn_tokens[0]
        for t in range(2, upto + 1):
            size += int(prompt_lens[t - 2]) + self.max_turn_tokens[t - 1]
        return size

    def prefix_bucket(self, n: int) -> int:
        return pick_bucket(n, self.prefix_buckets, "prefix length")

    def prompt_bucket(self, n: int) -> int:
        return pick_bucket(n, self.prompt_buckets, "turn prompt length")


def greedy_config(config: SamplerConfig) -> SamplerConfig:
    """The evaluation form of ``config``: one branch per turn, temperature 0 everywhere."""
    return config.replace(branching=(1, 1, 1, 1), temperature=(0.0,) * NUM_TURNS, top_k=0, top_p=1.0)
