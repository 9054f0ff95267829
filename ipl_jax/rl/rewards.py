"""UI-R1's rule reward on device: R = R_type + R_coord + R_format (each 0/1), + R_length with DAST; group
advantages are 0 for a group of equal or non-finite rewards.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.coat.actions import Action, invalid_action, needs_grounding, parse_action, parse_action_text
from ipl_jax.coat.metrics import MatchRules, get_rules
from ipl_jax.coat.rewards import CLICK_ID, LONG_PRESS_ID, GoldenActions, PredictedActions, encode_golden, exact_match
from ipl_jax.rl import losses


@dataclasses.dataclass(frozen=True)
class UIR1RewardConfig:
    """UI-R1 reward settings (a static jit argument): rules (``coat.metrics.RULES`` name or MatchRules),
    click_radius (for goldens without a box, screen fractions). DAST is ``group_rewards``' switch.
    """

    rules: str | MatchRules = "aitz"
    click_radius: float = 0.14

    def __post_init__(self):
        get_rules(self.rules)


@struct.dataclass
class UIR1Golden:
    """gold: ``coat.rewards.GoldenActions`` [N]; box: f32[N, 4] golden click target (fractions); has_box: bool[N]."""

    gold: GoldenActions
    box: jax.Array
    has_box: jax.Array


@struct.dataclass
class UIR1Rewards:
    """Each f32[...]: r_type, r_coord, r_format (0/1), r_length (0 without DAST), total; correct bool[...]."""

    r_type: jax.Array
    r_coord: jax.Array
    r_format: jax.Array
    r_length: jax.Array
    total: jax.Array
    correct: jax.Array


def encode_uir1_golden(steps: Sequence, max_elements: int = 16) -> UIR1Golden:
    """Golden ``Step``s -> ``UIR1Golden`` [N] (the golden click box is ``step.action.box`` when set)."""
    gold = encode_golden(list(steps), max_elements=max_elements)
    box = np.zeros((len(steps), 4), np.float32)
    has = np.zeros(len(steps), bool)
    for i, s in enumerate(steps):
        if needs_grounding(s.action) and s.action.box is not None:
            box[i], has[i] = s.action.box, True
    return UIR1Golden(gold=gold, box=jnp.asarray(box), has_box=jnp.asarray(has))


@functools.partial(jax.jit, static_argnames=("config",))
def uir1_rewards(
    pred: PredictedActions, format_ok: jax.Array, golden: UIR1Golden, config: UIR1RewardConfig = UIR1RewardConfig()
) -> UIR1Rewards:
    """The rule reward of predictions [...] against goldens [prefix]: R_type (type), R_coord (click inside the golden
    box, else the argument matches), R_format (``format_ok``); r_length = 0."""
    exact, type_match = exact_match(pred, golden.gold, get_rules(config.rules))
    nd, lead = pred.type_id.ndim, golden.has_box.ndim
    extra = (1,) * (nd - lead)  # golden [...prefix] broadcast against predictions [...]
    g_type = golden.gold.type_id.reshape(golden.gold.type_id.shape + extra)
    g_point = golden.gold.point.reshape(golden.gold.point.shape[:lead] + extra + (2,))
    box = golden.box.reshape(golden.box.shape[:lead] + extra + (4,))
    has_box = golden.has_box.reshape(golden.has_box.shape + extra)
    x, y = pred.point[..., 0], pred.point[..., 1]
    inside = (box[..., 0] <= x) & (x <= box[..., 2]) & (box[..., 1] <= y) & (y <= box[..., 3])
    near = jnp.sqrt(jnp.sum((pred.point - g_point) ** 2, axis=-1)) <= config.click_radius
    point_ok = pred.has_point & jnp.where(has_box, inside, near)
    is_click = (g_type == CLICK_ID) | (g_type == LONG_PRESS_ID)
    coord = type_match & jnp.where(is_click, point_ok, exact)
    r_type = type_match.astype(jnp.float32)
    r_coord = coord.astype(jnp.float32)
    r_format = jnp.asarray(format_ok, bool).astype(jnp.float32)
    zero = jnp.zeros_like(r_type)
    return UIR1Rewards(
        r_type=r_type,
        r_coord=r_coord,
        r_format=r_format,
        r_length=zero,
        total=r_type + r_coord + r_format,
        correct=coord,
    )


def group_rewards(rewards: UIR1Rewards, lengths: jax.Array, max_length: float, dast: bool) -> UIR1Rewards:
    """Adds the DAST length reward per group when ``dast``. rewards: [G, N]; lengths: unpadded [G, N];
    max_length: L_max."""
    if not dast:
        return rewards
    p = jnp.mean(rewards.correct.astype(jnp.float32), axis=-1)  # c / N per group
    r_len = jax.vmap(lambda n, c, pp: losses.dast_length_reward(n, c, max_length, pp))(
        jnp.asarray(lengths, jnp.float32), rewards.correct, p
    )
    return rewards.replace(r_length=r_len, total=rewards.total + r_len)


def safe_group_advantages(
    rewards: jax.Array, valid: jax.Array | None = None, eps: float = 1e-4, min_std: float = 1e-6
) -> jax.Array:
    """``losses.group_advantages`` that never returns NaN: 0 for groups of equal, non-finite or fewer than two valid
    rewards, and for invalid samples. rewards: f32[G, N]; valid: bool[G, N]."""
    r = jnp.asarray(rewards, jnp.float32)
    v = jnp.ones(r.shape, bool) if valid is None else jnp.asarray(valid, bool)
    finite = jnp.all(jnp.where(v, jnp.isfinite(r), True), axis=-1, keepdims=True)
    w = v.astype(jnp.float32)
    n = jnp.sum(w, axis=-1, keepdims=True)
    r0 = jnp.where(v & jnp.isfinite(r), r, 0.0)
    mean = jnp.sum(r0 * w, axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
    std = jnp.sqrt(jnp.sum(((r0 - mean) ** 2) * w, axis=-1, keepdims=True) / jnp.maximum(n, 1.0))
    adv = (r0 - mean) / (std + eps)
    ok = finite & (std >= min_std) & (n >= 2)
    return jnp.where(ok & v, adv, 0.0)


# ---------------------------------------------------------------------------------------------- text -> action

_THINK_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_COORD = re.compile(
    r"<\|box_start\|>.*?<\|box_end\|>|\(\s*-?\d+(?:\.\d+)?\s*,\s*-?\d+(?:\.\d+)?\s*\)"
    r"(?:\s*,?\s*\(\s*-?\d+(?:\.\d+)?\s*,\s*-?\d+(?:\.\d+)?\s*\))?",
    re.DOTALL,
)


def think_answer_format_ok(text: str) -> bool:
    """Whether ``text`` is exactly ``<think>…</think><answer>…</answer>`` (surrounding white space allowed)."""
    return isinstance(text, str) and _THINK_ANSWER.fullmatch(text) is not None


def parse_think_answer(text: str) -> tuple[Action, bool]:
    """(action, format_ok) of a UI-R1-style completion: our action text in ``<answer>``, click point in 0..1000;
    never raises (no ``<answer>``: invalid action)."""
    if not isinstance(text, str):
        return invalid_action(), False
    m = _ANSWER.search(text)
    if m is None:
        return invalid_action(), False
    answer = m.group(1).strip()
    coord = _COORD.search(answer)
    action_text = (answer[: coord.start()] + " " + answer[coord.end() :]).strip() if coord else answer
    return parse_action(action_text, answer if coord else None), think_answer_format_ok(text)


def coat_format_ok(s3: str, s4: str | None, finished: Sequence[bool]) -> bool:
    """The CoaT format reward: the action's turns ended with the end token, s3 parses, and s4 too for clicks."""
    a = parse_action_text(s3)
    if not a.parsed:
        return False
    turns = 4 if needs_grounding(a) else 3
    if not all(bool(f) for f in list(finished)[:turns]):
        return False
    if needs_grounding(a):
        return s4 is not None and parse_action(s3, s4).point is not None
    return True
