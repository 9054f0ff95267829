"""The optimizer of every trainer: AdamW on a warm-up + cosine (or constant) schedule, global-norm clipping,
weight decay masked off norms and biases.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import optax

from ipl_jax.training.lora import path_str

SCHEDULES = ("cosine", "constant")  # make_schedule's shapes (the job's sft.schedule and ipl.schedule)

# Path components containing 'norm' or 'bias', named 'scale' or starting with 'ln_' (layer norms, RMS norms,
# biases) get no weight decay.
NO_DECAY_REGEX = r"(^|/)([^/]*(norm|bias)[^/]*|scale|ln_[^/]*)(/|$)"


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """learning_rate (peak), schedule ("cosine" | "constant"), warmup_steps, total_steps (warm-up included), AdamW's
    b1, b2, eps, weight_decay, no_decay_regex, grad_clip_norm (<= 0 disables)."""

    learning_rate: float = 1e-5
    schedule: str = "cosine"
    warmup_steps: int = 0
    total_steps: int = 100
    end_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay_regex: str = NO_DECAY_REGEX
    grad_clip_norm: float = 1.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optimizer.schedule: unknown schedule {self.schedule!r} (expected one of {SCHEDULES})")
        if self.learning_rate < 0:
            raise ValueError(f"optimizer.learning_rate must be >= 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")


def make_schedule(s: OptimizerSettings) -> optax.Schedule:
    """Learning rate per optimizer update: linear warm-up from 0, then cosine decay or constant."""
    lr, warmup = float(s.learning_rate), int(s.warmup_steps)
    if s.schedule == "cosine":
        total = max(int(s.total_steps), warmup + 1)
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total, lr * float(s.end_lr_ratio))
    if warmup == 0:
        return optax.constant_schedule(lr)
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])


def decay_mask(params, no_decay_regex: str = NO_DECAY_REGEX):
    """bool tree: True where weight decay applies (kernels, embeddings; not norms, norm scales or biases)."""
    regex = re.compile(no_decay_regex)
    return jax.tree_util.tree_map_with_path(lambda p, _: not regex.search(path_str(p)), params)


def make_optimizer(s: OptimizerSettings) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW on ``make_schedule(s)``, weight decay masked by ``no_decay_regex``."""
    parts = []
    if s.grad_clip_norm > 0:
        parts.append(optax.clip_by_global_norm(s.grad_clip_norm))
    parts.append(
        optax.adamw(
            make_schedule(s),
            b1=s.b1,
            b2=s.b2,
            eps=s.eps,
            weight_decay=s.weight_decay,
            mask=lambda params: decay_mask(params, s.no_decay_regex),
        )
    )
    return optax.chain(*parts)
