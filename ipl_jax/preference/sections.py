"""The preference library's settings and the names they accept: the T-DPO loss (``DPOSettings``) and the round's pair
selection (``PairSelection``) are declared here once; the job's ``ipl`` section holds one of each (``ipl.dpo``,
``ipl.selection``) and hands that same object to the T-DPO step and the round. Importing this module loads no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.sections import Section, is_nonneg, is_positive, one_of

LOSS_KINDS = ("sigmoid", "ipo", "hinge")  # dpo_pair_losses' kinds (the job's ipl.dpo.loss_kind)
SFT_NORMS = ("token", "sum")  # positive_nll's normalisations (the job's ipl.dpo.sft_norm)


@dataclasses.dataclass(frozen=True)
class DPOSettings(Section):
    """The T-DPO loss (docs/method.md §7): the DPO term of ``loss_kind`` at ``beta`` plus ``sft_weight`` times the
    positive's NLL (normalised by ``sft_norm``)."""

    PATH: ClassVar[str] = "ipl.dpo"
    loss_kind: str = "sigmoid"
    """sigmoid | ipo | hinge."""
    beta: float = 0.1
    """DPO's β."""
    sft_weight: float = 1.0
    """Weight of the SFT term beside the DPO loss."""
    sft_norm: str = "token"
    """The SFT term's NLL: per "token", or "sum" over the turn like the DPO log-probs."""

    def __post_init__(self):
        self.need("loss_kind", self.loss_kind in LOSS_KINDS, one_of(LOSS_KINDS))
        self.need("sft_norm", self.sft_norm in SFT_NORMS, one_of(SFT_NORMS))
        self.need("beta", is_positive(self.beta), "must be > 0")
        self.need("sft_weight", is_nonneg(self.sft_weight), "must be >= 0")


@dataclasses.dataclass(frozen=True)
class PairSelection(Section):
    """Which of a round's pairs are trained on, in which order (``pairs.select_round_pairs``)."""

    PATH: ClassVar[str] = "ipl.selection"
    dedup: bool = True
    """Drop exact duplicate pairs (same prefix, positive and negative tokens)."""
    type_balance: float = 0.0
    """> 0: each positive action type keeps <= ceil(x * median type count) pairs a round."""
    mix_trees: bool = True
    """Pack the round's prefix groups in a seeded random order (batches mix trees)."""

    def __post_init__(self):
        self.need("type_balance", is_nonneg(self.type_balance), "must be >= 0 (0: off)")
