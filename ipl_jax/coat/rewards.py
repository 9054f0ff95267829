"""Leaf rewards of CoaT-trees and the value backup, vectorised in ``jnp`` (docs/method.md §4, §5).

A leaf is worth 1 on an exact match, v_type + score_match on a type match (the distance / F1 term for clicks
and typing), else 0. Actions are encoded into padded arrays on the host (``encode_actions``, ``encode_golden``).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.coat.actions import ACTION_TYPES, BUTTONS, DIRECTIONS, Action, box_center
from ipl_jax.coat.metrics import (
    MatchRules,
    StepLike,
    enlarge_box,
    finite_point,
    get_rules,
    in_box,
    normalise_text,
    text_tokens,
)
from ipl_jax.coat.sections import LeafRewardShares

CLICK_ID = ACTION_TYPES.index("click")
LONG_PRESS_ID = ACTION_TYPES.index("long_press")
TYPE_ID = ACTION_TYPES.index("type")
OPEN_APP_ID = ACTION_TYPES.index("open_app")
SCROLL_ID = ACTION_TYPES.index("scroll")
PRESS_ID = ACTION_TYPES.index("press")
INVALID_ID = -1


@dataclasses.dataclass(frozen=True)
class RewardConfig(LeafRewardShares):
    """Leaf reward settings (a static jit argument): the shares ``v_type`` / ``v_format`` (``coat.sections``) and
    ``rules``, a ``metrics.RULES`` name or ``MatchRules``."""

    rules: str | MatchRules = "aitz"

    def __post_init__(self):
        super().__post_init__()
        get_rules(self.rules)  # fail early on an unknown name


@struct.dataclass
class PredictedActions:
    """Padded predicted actions over any leading shape: type_id (-1 unparsed), has_point, point f32[..., 2],
    has_text, chars / num_chars (code points), words / num_words (word ids), direction, button (-1 absent).
    """

    type_id: jax.Array
    has_point: jax.Array
    point: jax.Array
    has_text: jax.Array
    chars: jax.Array
    num_chars: jax.Array
    words: jax.Array
    num_words: jax.Array
    direction: jax.Array
    button: jax.Array


@struct.dataclass
class GoldenActions:
    """Padded golden actions (leading shape a prefix of the leaves'): the ``PredictedActions`` fields plus boxes
    f32[..., E, 4], box_mask and box_clickable bool[..., E], aspect f32[...] (height / width).
    """

    type_id: jax.Array
    point: jax.Array
    chars: jax.Array
    num_chars: jax.Array
    words: jax.Array
    num_words: jax.Array
    direction: jax.Array
    button: jax.Array
    boxes: jax.Array
    box_mask: jax.Array
    box_clickable: jax.Array
    aspect: jax.Array


@struct.dataclass
class LeafRewards:
    """value: f32[...] in [0, 1]; exact: bool[...] (value == 1 exactly when set); type_match: bool[...]."""

    value: jax.Array
    exact: jax.Array
    type_match: jax.Array


# ---------------------------------------------------------------------------------------------- host side


def word_id(word: str) -> int:
    """The 31-bit id of one token for token F1 (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(word.encode("utf-8")) & 0x7FFFFFFF


def _encode_text(text, max_chars: int, max_words: int):
    chars = np.zeros(max_chars, np.int32)
    words = np.zeros(max_words, np.int32)
    if not isinstance(text, str):
        return False, chars, 0, words, 0
    norm = [ord(c) for c in normalise_text(text)][:max_chars]
    chars[: len(norm)] = norm
    toks = [word_id(w) for w in text_tokens(text)][:max_words]
    words[: len(toks)] = toks
    return True, chars, len(norm), words, len(toks)


def _type_id(action) -> int:
    if not isinstance(action, Action) or not action.parsed or action.type not in ACTION_TYPES:
        return INVALID_ID
    return ACTION_TYPES.index(action.type)


def _index(value, choices) -> int:
    return choices.index(value) if value in choices else -1


def encode_actions(actions: Sequence[Action | None], max_chars: int = 128, max_words: int = 32) -> PredictedActions:
    """Predicted actions (None or unparsed: invalid) as ``PredictedActions`` [N]; never raises.

    Texts: normalised code points (first ``max_chars``) and CRC-32 word ids (first ``max_words``).
    """
    n = len(actions)
    out = {
        "type_id": np.full(n, INVALID_ID, np.int32),
        "has_point": np.zeros(n, bool),
        "point": np.zeros((n, 2), np.float32),
        "has_text": np.zeros(n, bool),
        "chars": np.zeros((n, max_chars), np.int32),
        "num_chars": np.zeros(n, np.int32),
        "words": np.zeros((n, max_words), np.int32),
        "num_words": np.zeros(n, np.int32),
        "direction": np.full(n, -1, np.int32),
        "button": np.full(n, -1, np.int32),
    }
    for i, a in enumerate(actions):
        t = _type_id(a)
        out["type_id"][i] = t
        if t == INVALID_ID:
            continue
        p = finite_point(a.point) if a.point is not None else None
        if p is not None:
            out["has_point"][i] = True
            out["point"][i] = p
        has, chars, nc, words, nw = _encode_text(a.text, max_chars, max_words)
        out["has_text"][i], out["chars"][i], out["num_chars"][i] = has, chars, nc
        out["words"][i], out["num_words"][i] = words, nw
        out["direction"][i] = _index(a.direction, DIRECTIONS)
        out["button"][i] = _index(a.button, BUTTONS)
    return PredictedActions(**{k: jnp.asarray(v) for k, v in out.items()})


def encode_golden(
    steps: Sequence[StepLike],
    max_elements: int = 16,
    max_chars: int = 128,
    max_words: int = 32,
    keep_box_scale: float = 2.4,
) -> GoldenActions:
    """Golden steps as ``GoldenActions`` [N]; keeps at most ``max_elements`` boxes that could contain the golden
    point. ValueError naming the episode and step for an unusable golden action.
    """
    n = len(steps)
    out = {
        "type_id": np.zeros(n, np.int32),
        "point": np.zeros((n, 2), np.float32),
        "chars": np.zeros((n, max_chars), np.int32),
        "num_chars": np.zeros(n, np.int32),
        "words": np.zeros((n, max_words), np.int32),
        "num_words": np.zeros(n, np.int32),
        "direction": np.full(n, -1, np.int32),
        "button": np.full(n, -1, np.int32),
        "boxes": np.zeros((n, max_elements, 4), np.float32),
        "box_mask": np.zeros((n, max_elements), bool),
        "box_clickable": np.zeros((n, max_elements), bool),
        "aspect": np.ones(n, np.float32),
    }
    for i, step in enumerate(steps):
        a = step.action
        where = f"episode {step.episode_id!r} step {step.step_id}"
        if not a.parsed or a.type not in ACTION_TYPES:
            raise ValueError(f"{where}: golden action has unknown type {a.type!r}")
        out["type_id"][i] = ACTION_TYPES.index(a.type)
        w, h = step.screen_size
        out["aspect"][i] = float(h) / float(w) if w else 1.0
        if a.type in ("click", "long_press"):
            g = a.point if a.point is not None else (box_center(a.box) if a.box is not None else None)
            if g is None:
                raise ValueError(f"{where}: golden {a.type} has neither a point nor a box")
            out["point"][i] = g
            kept = [e for e in step.elements if in_box(g, enlarge_box(e.box, keep_box_scale))][:max_elements]
            for j, e in enumerate(kept):
                out["boxes"][i, j] = e.box
                out["box_mask"][i, j] = True
                out["box_clickable"][i, j] = bool(e.clickable)
        _, chars, nc, words, nw = _encode_text(a.text, max_chars, max_words)
        out["chars"][i], out["num_chars"][i], out["words"][i], out["num_words"][i] = chars, nc, words, nw
        out["direction"][i] = _index(a.direction, DIRECTIONS)
        out["button"][i] = _index(a.button, BUTTONS)
    return GoldenActions(**{k: jnp.asarray(v) for k, v in out.items()})


def reshape_leading(tree, shape: Sequence[int]):
    """Reshape the leading axis ``[N]`` of every array of ``tree`` to ``shape`` (prod(shape) == N)."""
    shape = tuple(int(s) for s in shape)
    return jax.tree.map(lambda x: x.reshape(shape + x.shape[1:]), tree)


# ----------------------------------------------------------------------------------------------- kernels


def _contains(needle, needle_len, hay, hay_len):
    """Whether needle[:needle_len] occurs in hay[:hay_len]: int32[..., C], int32[..., C'], lengths -> bool[...]."""
    c, ch = needle.shape[-1], hay.shape[-1]
    offsets = jnp.arange(ch)
    pos = jnp.arange(c)
    windows = hay[..., jnp.clip(offsets[:, None] + pos[None, :], 0, ch - 1)]  # [..., C', C]
    same = (windows == needle[..., None, :]) | (pos >= needle_len[..., None, None])
    fits = offsets + needle_len[..., None] <= hay_len[..., None]  # [..., C']
    return jnp.any(jnp.all(same, axis=-1) & fits, axis=-1)


def _text_equal(a, a_len, b, b_len):
    n = max(a.shape[-1], b.shape[-1])
    pos = jnp.arange(n)
    a = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, n - a.shape[-1])])
    b = jnp.pad(b, [(0, 0)] * (b.ndim - 1) + [(0, n - b.shape[-1])])
    same = (a == b) | (pos >= a_len[..., None])
    return (a_len == b_len) & jnp.all(same, axis=-1)


def token_f1(p_ids, p_len, g_ids, g_len):
    """Token-level F1 over multisets of ids: int32[..., L] + lengths -> f32[...] (both empty 1, one empty 0)."""
    p_valid = jnp.arange(p_ids.shape[-1]) < p_len[..., None]
    g_valid = jnp.arange(g_ids.shape[-1]) < g_len[..., None]
    # for each predicted token i: its count among the predicted tokens and among the golden tokens
    count_p = jnp.sum((p_ids[..., :, None] == p_ids[..., None, :]) & p_valid[..., None, :], axis=-1)
    count_g = jnp.sum((p_ids[..., :, None] == g_ids[..., None, :]) & g_valid[..., None, :], axis=-1)
    share = jnp.minimum(count_p, count_g) / jnp.maximum(count_p, 1)
    common = jnp.sum(jnp.where(p_valid, share, 0.0), axis=-1)
    precision = common / jnp.maximum(p_len, 1)
    recall = common / jnp.maximum(g_len, 1)
    f1 = jnp.where(common > 0, 2 * precision * recall / jnp.maximum(precision + recall, 1e-12), 0.0)
    either_empty = (p_len == 0) | (g_len == 0)
    return jnp.where(either_empty, ((p_len == 0) & (g_len == 0)).astype(f1.dtype), f1).astype(jnp.float32)


def _expand_golden(gold: GoldenActions, batch_ndim: int) -> GoldenActions:
    lead = gold.type_id.ndim
    extra = batch_ndim - lead
    if extra < 0:
        raise ValueError(f"golden batch rank {lead} exceeds the leaves' batch rank {batch_ndim}")
    return jax.tree.map(lambda x: x.reshape(x.shape[:lead] + (1,) * extra + x.shape[lead:]), gold)


def _point_exact(pred: PredictedActions, gold: GoldenActions, rules: MatchRules):
    p, g = pred.point, gold.point
    hit = jnp.zeros(pred.has_point.shape, bool)
    if rules.box_scale is not None:
        b = gold.boxes
        cx, cy = (b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2
        hw, hh = (b[..., 2] - b[..., 0]) * rules.box_scale / 2, (b[..., 3] - b[..., 1]) * rules.box_scale / 2
        x1, y1 = jnp.maximum(0.0, cx - hw), jnp.maximum(0.0, cy - hh)
        x2, y2 = jnp.minimum(1.0, cx + hw), jnp.minimum(1.0, cy + hh)

        def inside(pt):
            x, y = pt[..., None, 0], pt[..., None, 1]
            return (x1 <= x) & (x <= x2) & (y1 <= y) & (y <= y2)

        usable = gold.box_mask & (gold.box_clickable if rules.elements == "clickable" else True)
        hit = jnp.any(usable & inside(g) & inside(p), axis=-1)
    dx, dy = p[..., 0] - g[..., 0], p[..., 1] - g[..., 1]
    if rules.distance == "width_px":
        measured = jnp.sqrt(dx * dx + (dy * gold.aspect) ** 2)
    else:
        measured = jnp.sqrt(dx * dx + dy * dy)
    return pred.has_point & (hit | (measured <= rules.click_threshold))


def _text_exact(pred: PredictedActions, gold: GoldenActions, rules: MatchRules):
    if rules.text == "ignore":
        return jnp.ones(pred.has_text.shape, bool)
    if rules.text == "contains":
        either = _contains(pred.chars, pred.num_chars, gold.chars, gold.num_chars) | _contains(
            gold.chars, gold.num_chars, pred.chars, pred.num_chars
        )
        ok = jnp.where(pred.num_chars == 0, gold.num_chars == 0, either)
    else:
        f1 = token_f1(pred.words, pred.num_words, gold.words, gold.num_words)
        ok = _text_equal(pred.chars, pred.num_chars, gold.chars, gold.num_chars) | (f1 > rules.f1_threshold)
    return pred.has_text & ok


def exact_match(pred: PredictedActions, gold: GoldenActions, rules: MatchRules) -> tuple[jax.Array, jax.Array]:
    """(exact, type_match), both bool[...], under ``rules`` — the jnp twin of ``metrics.match_action``."""
    gold = _expand_golden(gold, pred.type_id.ndim)
    type_match = (pred.type_id >= 0) & (pred.type_id == gold.type_id)
    if rules.scroll == "axis":
        scroll_ok = (pred.direction >= 0) & (pred.direction // 2 == gold.direction // 2)
    else:
        scroll_ok = (pred.direction >= 0) & (pred.direction == gold.direction)
    press_ok = (pred.button >= 0) & (pred.button == gold.button)
    t = gold.type_id
    is_point = (t == CLICK_ID) | (t == LONG_PRESS_ID)
    is_text = (t == TYPE_ID) | (t == OPEN_APP_ID)
    rule_ok = jnp.where(
        is_point,
        _point_exact(pred, gold, rules),
        jnp.where(
            is_text,
            _text_exact(pred, gold, rules),
            jnp.where(t == SCROLL_ID, scroll_ok, jnp.where(t == PRESS_ID, press_ok, True)),
        ),
    )
    return type_match & rule_ok, type_match


@functools.partial(jax.jit, static_argnames=("config",))
def leaf_rewards(pred: PredictedActions, gold: GoldenActions, config: RewardConfig = RewardConfig()) -> LeafRewards:
    """Leaf values (docs/method.md §4) of predictions ``[...]`` against goldens ``[prefix]``; a value of 1 is a
    Step.Acc hit. Distance / F1 terms apply to golden click and type only."""
    rules = get_rules(config.rules)
    exact, type_match = exact_match(pred, gold, rules)
    gold = _expand_golden(gold, pred.type_id.ndim)
    dense = 1.0 - config.v_type - config.v_format
    d = jnp.sqrt(jnp.sum((pred.point - gold.point) ** 2, axis=-1))
    click_score = jnp.where(pred.has_point, config.v_format + dense * (1.0 - jnp.clip(d, 0.0, 1.0)), 0.0)
    f1 = token_f1(pred.words, pred.num_words, gold.words, gold.num_words)
    type_score = jnp.where(pred.has_text, config.v_format + dense * f1, 0.0)
    score_match = jnp.where(gold.type_id == CLICK_ID, click_score, jnp.where(gold.type_id == TYPE_ID, type_score, 0.0))
    value = jnp.where(exact, 1.0, jnp.where(type_match, config.v_type + score_match, 0.0)).astype(jnp.float32)
    return LeafRewards(value=value, exact=exact, type_match=type_match)


# ------------------------------------------------------------------------------------------------ backup


def backup_values(leaf_values: jax.Array, branching: Sequence[int], discount: float = 0.95) -> tuple[jax.Array, ...]:
    """Node values of every level from leaf values f32[B, b1, ..., bn]: v(parent) = c · mean(children) (docs/method.md
    §5). Returns n arrays, level t f32[B, b1, ..., bt], the last the leaves.
    """
    branching = tuple(int(b) for b in branching)
    if not branching or any(b < 1 for b in branching):
        raise ValueError(f"branching must be positive ints, got {branching}")
    leaves = jnp.asarray(leaf_values)
    leaves = leaves.reshape((leaves.shape[0],) + branching)
    levels = [leaves]
    for _ in branching[:-1]:
        levels.append(discount * jnp.mean(levels[-1], axis=-1))
    return tuple(reversed(levels))
