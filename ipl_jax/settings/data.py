"""The data sections: the dataset and its splits (``data``) and instruction evolution (``evolution``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.data.datasets import ALIASES, LOADERS, TFDS_PREFIX, canonical_format
from ipl_jax.sections import Section


@dataclasses.dataclass(frozen=True)
class DataSettings(Section):
    PATH: ClassVar[str] = "data"
    format: str = "synthetic"
    """synthetic | aitz | amex | androidcontrol | arrayrecord | tfds:NAME."""
    root: str = ""
    """The real datasets' local directory."""
    train_episodes: int = 300
    """Synthetic training episodes."""
    dev_episodes: int = 12
    """Synthetic dev episodes."""
    test_episodes: int = 40
    """Episodes per synthetic test split (~225 steps: a gain's 95 % interval is about ±2.5 points)."""
    test_splits: tuple[str, ...] = ("test", "test_app_unseen", "test_task_unseen")
    """The test splits evaluated."""
    dev_split: str = "dev"
    """The dev split; "" (real AITZ has none): hold out the last `dev_holdout` training episodes."""
    dev_holdout: int = 20
    """Training episodes held out as dev when `dev_split` is empty."""
    png_level: int = 1
    """PNG compression of the written screenshots (1: fast, files a bit larger)."""
    loader_threads: int = 2
    """Grain threads building SFT batches."""
    store: str = "aitz"
    """How the job writes the synthetic world: aitz (a directory tree) | arrayrecord (shards)."""
    shards: int = 1
    """ArrayRecord shards per split when `store` is arrayrecord."""
    skip_bad: bool = False
    """Leave malformed dataset records out (counted and reported) instead of stopping."""
    coat_fallback: bool = False
    """Steps without CoaT: SFT leaves them out (counted); True makes up their texts (element list,
    step instruction: datasets published without CoaT)."""
    annotated_episodes: int = 0
    """Scarce annotations (with `action_episodes` > 0): N training episodes, a seeded choice, keep their
    CoaT (warm-up SFT, evolution, continued SFT)."""
    action_episodes: int = 0
    """M other training episodes read as action logs (golden action, screen, history) for the rounds;
    N + M <= the training episodes."""
    action_root: str = ""
    """Action logs from another dataset's train split: N (0: all) of `root` annotated, M (0: all) of it."""
    action_format: str = ""
    """Their format: aitz | amex | android_control | arrayrecord | tfds:NAME ("": `format`)."""

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

    def rules(self) -> str:
        """The exact-match rule set of this data (its scoring format's; packed and TFDS data say theirs)."""
        from ipl_jax.coat.metrics import DEFAULT_RULES  # imported when asked (no JAX on import)
        from ipl_jax.data.datasets import scoring_format

        return DEFAULT_RULES[scoring_format(self.format, self.root)]

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
    enabled: bool = True
    """Evolve the training screens' instructions into Q&A items for warm-up SFT."""
    levels: tuple[int, ...] = (1, 2, 3)
    """The Q&A levels made (a subset of 1, 2, 3)."""
    per_step: int = 2
    """Q&A items per training screen."""
    max_items: int = 1200
    """Q&A items in all, at most."""
    screens: str = "annotated"
    """Screens asked about: "all" training screens (action-only ones too) or the "annotated" ones."""

    def __post_init__(self):
        self.need("levels", bool(self.levels) and set(self.levels) <= {1, 2, 3}, "must be a subset of 1, 2, 3")
        self.at_least("per_step max_items", 0)
        self.need("screens", self.screens in ("all", "annotated"), "must be all or annotated")
