"""Step-level action matching (Step.Acc): one predicted action against one golden step (docs/method.md §8).
Never raises on the prediction (anything unusable is a miss); ``RULES`` holds the benchmarks' rule sets, also
read by the on-device reward.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ipl_jax.coat.actions import ACTION_TYPES, DIRECTIONS, Action, box_center, invalid_action

# The step records of data/ (``data.records.Step`` / ``Episode`` / ``UIElement``) are read in coat/ by their
# attributes only: coat/ sits below data/ and never imports it.
StepLike = Any
EpisodeLike = Any
ElementLike = Any

POINT_TYPES = ("click", "long_press")
TEXT_TYPES = ("type", "open_app")


@dataclasses.dataclass(frozen=True)
class MatchRules:
    """One rule set for exact matching (hashable): box_scale (None: no box rule), click_threshold, distance
    ("screen" | "width_px"), elements ("all" | "clickable"), scroll ("direction" | "axis"), text ("contains" |
    "equal_or_f1" | "ignore").
    """

    name: str
    box_scale: float | None = 1.2
    click_threshold: float = 0.14
    distance: str = "screen"
    elements: str = "all"
    scroll: str = "direction"
    text: str = "contains"
    f1_threshold: float = 0.5

    def __post_init__(self):
        if self.distance not in ("screen", "width_px"):
            raise ValueError(f"MatchRules.distance must be 'screen' or 'width_px', got {self.distance!r}")
        if self.elements not in ("all", "clickable"):
            raise ValueError(f"MatchRules.elements must be 'all' or 'clickable', got {self.elements!r}")
        if self.scroll not in ("direction", "axis"):
            raise ValueError(f"MatchRules.scroll must be 'direction' or 'axis', got {self.scroll!r}")
        if self.text not in ("contains", "equal_or_f1", "ignore"):
            raise ValueError(f"MatchRules.text must be 'contains', 'equal_or_f1' or 'ignore', got {self.text!r}")


# aitz: the modern AITZ rules -- click / long-press exact if the point lies in a golden-screen UI box (x1.2 about
# its centre, clamped to the screen) that also holds the golden point, else within 0.14 (L2, screen fractions);
# scroll: same finger direction; type: lower-case + strip, either contains the other; press: same button; stop:
# type match. aitw: Google's older matcher (boxes x2.4, a scroll's main axis, typed text ignored). amex: aitz
# with the boxes of clickable elements only. androidcontrol: OS-Atlas's protocol (click within 140 on the 0..1000
# scale, texts equal or token F1 > 0.5). androidcontrol_uir1: UI-R1's (click within 0.14 x the width, in pixels).
RULES: dict[str, MatchRules] = {
    "aitz": MatchRules("aitz"),
    "aitw": MatchRules("aitw", box_scale=2.4, scroll="axis", text="ignore"),
    "amex": MatchRules("amex", elements="clickable"),
    "androidcontrol": MatchRules("androidcontrol", box_scale=None, text="equal_or_f1"),
    "androidcontrol_uir1": MatchRules("androidcontrol_uir1", box_scale=None, distance="width_px", text="equal_or_f1"),
}
# The rule set each dataset format is scored with unless the caller names another.
DEFAULT_RULES = {"aitz": "aitz", "amex": "amex", "androidcontrol": "androidcontrol"}
FORMATS = tuple(DEFAULT_RULES)


def get_rules(rules: str | MatchRules) -> MatchRules:
    if isinstance(rules, MatchRules):
        return rules
    if rules not in RULES:
        raise ValueError(f"unknown rule set {rules!r}; known: {', '.join(RULES)}")
    return RULES[rules]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The judgement of one predicted action against one golden step; ``details`` names the deciding ``rule`` and
    what it measured.
    """

    type_match: bool
    exact_match: bool
    details: dict = dataclasses.field(default_factory=dict, compare=False)


# ------------------------------------------------------------------------------------------------ text


def normalise_text(text: str | None) -> str:
    """The form texts are compared in: lower-case, stripped."""
    return (text or "").lower().strip()


def text_tokens(text: str | None) -> list[str]:
    """The tokens of token-level F1: lower-cased whitespace-separated words."""
    return (text or "").lower().split()


def token_f1(pred: str | None, gold: str | None) -> float:
    """Token-level F1 of two texts over multisets of ``text_tokens``. Both empty -> 1.0, one empty -> 0.0."""
    p, g = text_tokens(pred), text_tokens(gold)
    if not p or not g:
        return float(not p and not g)
    common = sum((collections.Counter(p) & collections.Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def text_contains_match(pred: str | None, gold: str | None) -> bool:
    """AITZ's type rule: after lower/strip, either contains the other (an empty prediction needs an empty gold)."""
    p, g = normalise_text(pred), normalise_text(gold)
    if not p:
        return not g
    return p in g or g in p


# ----------------------------------------------------------------------------------------------- geometry


def enlarge_box(box: Sequence[float], scale: float) -> tuple[float, float, float, float]:
    """``box`` (x1, y1, x2, y2) scaled by ``scale`` about its centre, clamped to the unit screen."""
    x1, y1, x2, y2 = (float(v) for v in box)
    cx, cy = (x1 + x2) / 2.0, (y1 + y2) / 2.0
    hw, hh = (x2 - x1) * scale / 2.0, (y2 - y1) * scale / 2.0
    return (max(0.0, cx - hw), max(0.0, cy - hh), min(1.0, cx + hw), min(1.0, cy + hh))


def in_box(point: Sequence[float], box: Sequence[float]) -> bool:
    """Whether (x, y) lies in (x1, y1, x2, y2), edges included."""
    x, y = point
    return box[0] <= x <= box[2] and box[1] <= y <= box[3]


def finite_point(p) -> tuple[float, float] | None:
    """(x, y) as floats when ``p`` holds two finite numbers, else None (a malformed prediction is a miss)."""
    try:
        x, y = float(p[0]), float(p[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return (x, y) if math.isfinite(x) and math.isfinite(y) else None


def match_boxes(elements: Iterable[ElementLike], rules: MatchRules) -> list[tuple[float, float, float, float]]:
    """The golden boxes the click rule uses: the elements' boxes (clickable ones only if the rules say so)."""
    return [tuple(e.box) for e in elements if rules.elements == "all" or e.clickable]


def _match_point(pred: Action, gold: Action, elements, screen_size, rules: MatchRules) -> tuple[bool, dict]:
    p = finite_point(pred.point) if pred.point is not None else None
    g = gold.point if gold.point is not None else (box_center(gold.box) if gold.box is not None else None)
    if g is None:
        raise ValueError("golden point action has neither a point nor a box")
    if p is None:
        return False, {"rule": "no_point"}
    dx, dy = p[0] - g[0], p[1] - g[1]
    distance = math.hypot(dx, dy)
    details = {"distance": distance, "in_box": False, "gold_in_box": False}
    if rules.box_scale is not None:
        for box in match_boxes(elements, rules):
            big = enlarge_box(box, rules.box_scale)
            if in_box(g, big):
                details["gold_in_box"] = True
                if in_box(p, big):
                    details["in_box"] = True
                    details["rule"] = "box"
                    return True, details
    if rules.distance == "width_px":
        if screen_size is None:
            raise ValueError("the 'width_px' distance needs the screen size")
        w, h = screen_size
        measured = math.hypot(dx * w, dy * h) / w
    else:
        measured = distance
    details["measured"] = measured
    ok = measured <= rules.click_threshold
    details["rule"] = "distance" if ok else "miss"
    return ok, details


def _match_text(pred: Action, gold: Action, rules: MatchRules) -> tuple[bool, dict]:
    if rules.text == "ignore":
        return True, {"rule": "type_only"}
    if not isinstance(pred.text, str):
        return False, {"rule": "no_text"}
    if rules.text == "contains":
        ok = text_contains_match(pred.text, gold.text)
        return ok, {"rule": "contains" if ok else "miss"}
    f1 = token_f1(pred.text, gold.text)
    ok = normalise_text(pred.text) == normalise_text(gold.text) or f1 > rules.f1_threshold
    return ok, {"rule": "equal_or_f1" if ok else "miss", "f1": f1}


def _axis(direction: str | None) -> str | None:
    if direction in ("up", "down"):
        return "vertical"
    if direction in ("left", "right"):
        return "horizontal"
    return None


def match_action(
    pred: Action,
    gold: Action,
    elements: Sequence[ElementLike] = (),
    screen_size: tuple[int, int] | None = None,
    rules: str | MatchRules = "aitz",
) -> Verdict:
    """Judge ``pred`` against golden ``gold`` on a screen with golden ``elements``; ValueError only for an unusable
    golden or rule set. ``screen_size`` (pixels) is needed by the ``width_px`` distance only.
    """
    rules = get_rules(rules)
    if not isinstance(pred, Action) or not pred.parsed or pred.type not in ACTION_TYPES:
        return Verdict(False, False, {"rule": "unparsed"})
    if pred.type != gold.type:
        return Verdict(False, False, {"rule": "type_mismatch", "pred_type": pred.type})
    t = gold.type
    if t in POINT_TYPES:
        ok, details = _match_point(pred, gold, elements, screen_size, rules)
    elif t in TEXT_TYPES:
        ok, details = _match_text(pred, gold, rules)
    elif t == "scroll":
        if rules.scroll == "axis":
            ok = _axis(pred.direction) is not None and _axis(pred.direction) == _axis(gold.direction)
        else:
            ok = pred.direction in DIRECTIONS and pred.direction == gold.direction
        details = {"rule": rules.scroll if ok else "miss"}
    elif t == "press":
        ok = pred.button is not None and pred.button == gold.button
        details = {"rule": "button" if ok else "miss"}
    else:  # stop, wait
        ok, details = True, {"rule": "type_only"}
    return Verdict(True, bool(ok), details)


def match_step(pred: Action | None, step: StepLike, rules: str | MatchRules = "aitz") -> Verdict:
    """Judge ``pred`` (None: a miss) against a golden step; errors name the episode and step. ``press back`` vs
    ``press home`` is a type match only; ``stop`` ignores status; a golden point action without point uses its box."""
    if pred is None:
        pred = invalid_action()
    try:
        return match_action(pred, step.action, step.elements, step.screen_size, rules)
    except ValueError as e:
        raise ValueError(f"episode {step.episode_id!r} step {step.step_id}: {e}") from None
