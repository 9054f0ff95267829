"""Known-answer tests for the matching rules and the Step.Acc tables (ipl_jax/metrics.py)."""

import math
import random

import pytest

from ipl_jax.coat.actions import Action, invalid_action, parse_action
from ipl_jax.coat.metrics import enlarge_box, match_action, match_step, text_contains_match, token_f1
from ipl_jax.coat.tables import format_table, score_episodes
from ipl_jax.data.records import Episode, Step, UIElement


def click(x, y):
    return Action(type="click", point=(x, y))


def verdict(pred, gold, elements=(), rules="aitz", screen=(1080, 2400)):
    v = match_action(pred, gold, elements, screen, rules)
    return v.type_match, v.exact_match


# ---------------------------------------------------------------------------------------------- clicks

WIDE_ROW = UIElement(box=(0.0, 0.5, 1.0, 0.55), text="Wi-Fi")
SMALL = UIElement(box=(0.4, 0.4, 0.6, 0.5), text="OK")


def test_enlarge_box_known_values_and_clamp():
    assert enlarge_box((0.4, 0.4, 0.6, 0.5), 1.2) == pytest.approx((0.38, 0.39, 0.62, 0.51))
    assert enlarge_box((0.4, 0.4, 0.6, 0.5), 2.4) == pytest.approx((0.26, 0.33, 0.74, 0.57))
    # a box at the top-right corner is clamped to the screen
    assert enlarge_box((0.9, 0.0, 1.0, 0.1), 1.2) == pytest.approx((0.89, 0.0, 1.0, 0.11))


def test_click_same_box_is_exact_even_when_far():
    gold = click(0.1, 0.52)
    assert verdict(click(0.9, 0.53), gold, [WIDE_ROW]) == (True, True)
    assert match_action(click(0.9, 0.53), gold, [WIDE_ROW]).details["rule"] == "box"
    # without the box the same prediction is 0.8 away: a miss
    assert verdict(click(0.9, 0.53), gold, []) == (True, False)


def test_click_enlarged_box_boundary():
    gold = click(0.39, 0.40)  # inside the x1.2 box only
    # inside the enlarged box, outside the original one, 0.25 away from the golden point
    v = match_action(click(0.615, 0.505), gold, [SMALL])
    assert (v.type_match, v.exact_match, v.details["rule"]) == (True, True, "box")
    # just outside the enlarged box (x > 0.62) and 0.245 away: a miss under the modern rules ...
    assert verdict(click(0.63, 0.45), gold, [SMALL]) == (True, False)
    # ... but a match under the older AITW matcher, whose boxes are x2.4
    assert verdict(click(0.63, 0.45), gold, [SMALL], rules="aitw") == (True, True)


def test_click_box_must_contain_both_points():
    a = UIElement(box=(0.0, 0.0, 0.2, 0.1))
    b = UIElement(box=(0.5, 0.5, 0.7, 0.6))
    assert verdict(click(0.6, 0.55), click(0.1, 0.05), [a, b]) == (True, False)


def test_click_distance_rule_when_no_box_holds_gold():
    gold = click(0.5, 0.9)
    assert verdict(click(0.5, 0.77), gold, [SMALL]) == (True, True)  # 0.13
    assert verdict(click(0.5, 0.75), gold, [SMALL]) == (True, False)  # 0.15
    assert verdict(click(0.6, 0.8), gold) == (True, False)  # hypot(0.1, 0.1) = 0.1414 > 0.14
    d = match_action(click(0.6, 0.8), gold).details
    assert d["distance"] == pytest.approx(math.sqrt(0.02)) and d["rule"] == "miss"


def test_click_distance_exact_threshold_values():
    gold = click(0.2, 0.2)
    assert verdict(click(0.2 + 0.1, 0.2 + 0.1), gold) == (True, False)  # 0.1414 > 0.14
    assert verdict(click(0.2 + 0.084, 0.2 + 0.112), gold) == (True, True)  # 3-4-5: exactly 0.14


def test_amex_uses_only_clickable_boxes():
    row = UIElement(box=(0.0, 0.5, 1.0, 0.55), clickable=False)
    gold = click(0.1, 0.52)
    assert verdict(click(0.9, 0.53), gold, [row], rules="aitz") == (True, True)
    assert verdict(click(0.9, 0.53), gold, [row], rules="amex") == (True, False)


def test_android_control_protocols():
    gold = click(0.5, 0.5)
    # OS-Atlas: 0.08 of the screen = 80 on the 0..1000 scale: within 140
    assert verdict(click(0.5, 0.58), gold, rules="androidcontrol", screen=(1000, 2000)) == (True, True)
    # UI-R1: 0.08 of a 2000-px height is 160 px > 0.14 x 1000-px width
    assert verdict(click(0.5, 0.58), gold, rules="androidcontrol_uir1", screen=(1000, 2000)) == (True, False)
    assert verdict(click(0.5, 0.565), gold, rules="androidcontrol_uir1", screen=(1000, 2000)) == (True, True)
    # boxes play no part in AndroidControl
    assert verdict(click(0.9, 0.53), click(0.1, 0.52), [WIDE_ROW], rules="androidcontrol") == (True, False)


def test_long_press_uses_point_rule_and_is_not_a_click():
    gold = Action(type="long_press", point=(0.3, 0.3))
    assert verdict(Action(type="long_press", point=(0.31, 0.3)), gold) == (True, True)
    assert verdict(click(0.3, 0.3), gold) == (False, False)


def test_click_without_point_is_a_type_match_only():
    pred = parse_action("click the button", "no box here")
    assert pred.parsed and pred.point is None
    v = match_action(pred, click(0.5, 0.5))
    assert (v.type_match, v.exact_match, v.details["rule"]) == (True, False, "no_point")


def test_click_from_text_prediction():
    pred = parse_action("click OK", "<|box_start|>(400,400),(600,500)<|box_end|>")
    assert verdict(pred, click(0.5, 0.45), [SMALL]) == (True, True)


# -------------------------------------------------------------------------------------- other action types


def test_scroll_rules():
    up, down, left = (Action(type="scroll", direction=d) for d in ("up", "down", "left"))
    assert verdict(up, up) == (True, True)
    assert verdict(down, up) == (True, False)
    assert verdict(down, up, rules="aitw") == (True, True)  # same main axis
    assert verdict(left, up, rules="aitw") == (True, False)
    assert verdict(Action(type="scroll", direction=None), up) == (True, False)


def test_text_contains_and_f1():
    assert text_contains_match(" Hello World ", "hello world")
    assert text_contains_match("hello", "Hello World")
    assert text_contains_match("New York City, NY", "new york city")
    assert not text_contains_match("world cup", "hello world")
    assert not text_contains_match("", "abc")
    assert text_contains_match("  ", "")
    assert token_f1("a b b", "b b c") == pytest.approx(2 / 3)
    assert token_f1("New York", "new york city") == pytest.approx(0.8)
    assert token_f1("", "") == 1.0 and token_f1("a", "") == 0.0 and token_f1("x", "y") == 0.0


def test_type_rules():
    def t(s):
        return Action(type="type", text=s)

    assert verdict(t("Hello World "), t("hello world")) == (True, True)
    assert verdict(t("hello"), t("hello world")) == (True, True)
    assert verdict(t("world cup"), t("hello world")) == (True, False)
    assert verdict(t(""), t("hello")) == (True, False)
    assert verdict(t("anything"), t("hello"), rules="aitw") == (True, True)  # text ignored
    # OS-Atlas: equal or token F1 > 0.5
    assert verdict(t("new york"), t("new york city"), rules="androidcontrol") == (True, True)  # F1 0.8
    assert verdict(t("york"), t("new york city"), rules="androidcontrol") == (True, False)  # F1 0.5
    assert verdict(t("York "), t("york"), rules="androidcontrol") == (True, True)
    assert verdict(Action(type="type", text=None), t("x")) == (True, False)


def test_open_app_and_wait():
    def app(s):
        return Action(type="open_app", text=s)

    assert verdict(app("Gmail"), app("gmail"), rules="androidcontrol") == (True, True)
    assert verdict(app("Google Maps"), app("Maps"), rules="androidcontrol") == (True, True)  # F1 2/3
    assert verdict(app("Chrome"), app("Maps"), rules="androidcontrol") == (True, False)
    assert verdict(Action(type="wait"), Action(type="wait")) == (True, True)


def test_press_and_stop():
    back, home = Action(type="press", button="back"), Action(type="press", button="home")
    assert verdict(back, back) == (True, True)
    assert verdict(home, back) == (True, False)
    stop = Action(type="stop")
    assert verdict(Action(type="stop", status="impossible"), stop) == (True, True)
    assert verdict(back, stop) == (False, False)


def test_unparsed_and_odd_predictions_never_raise():
    gold = click(0.5, 0.5)
    assert verdict(invalid_action(), gold) == (False, False)
    assert verdict(parse_action("I think we should tap"), gold) == (False, False)
    assert match_action(None, gold).details["rule"] == "unparsed"
    rng = random.Random(0)
    golds = [
        gold,
        Action(type="type", text="hi"),
        Action(type="scroll", direction="up"),
        Action(type="press", button="back"),
        Action(type="stop"),
    ]
    odd_values = [None, "", "up", float("nan"), (float("nan"), 0.2), (0.1,), "x y", 3, (0.2, 0.3)]
    for _ in range(300):
        kw = {f: rng.choice(odd_values) for f in ("point", "text", "direction", "button")}
        pred = Action(
            type=rng.choice(["click", "type", "scroll", "press", "stop", "zap"]), parsed=rng.random() < 0.8, **kw
        )
        v = match_action(pred, rng.choice(golds), [SMALL])
        assert isinstance(v.exact_match, bool) and isinstance(v.type_match, bool)
        assert not v.exact_match or v.type_match


def test_golden_click_without_point_names_the_step():
    step = Step("ep7", 3, "go", b"", (10, 10), Action(type="click"))
    with pytest.raises(ValueError, match="ep7.*step 3"):
        match_step(click(0.1, 0.1), step)


# -------------------------------------------------------------------------------------------------- tables


def _step(ep, i, action, elements=(), **meta):
    return Step(ep, i, "goal", b"", (1080, 2400), action, elements=elements, meta=meta)


def fixture_episodes():
    """Three episodes, 9 steps; the predictions below make 7 exact, 8 type matches, 8 parsed."""
    a = Episode(
        "A",
        "goal",
        (
            _step("A", 0, click(0.5, 0.45), [SMALL], app="gmail", subsplits=["IDD"]),
            _step("A", 1, Action(type="type", text="hello"), app="gmail", subsplits=["IDD"]),
            _step("A", 2, Action(type="stop"), app="gmail", subsplits=["IDD"]),
        ),
    )
    b = Episode(
        "B",
        "goal",
        (
            _step("B", 0, Action(type="scroll", direction="up"), app="yelp", subsplits=["IDD", "app_unseen"]),
            _step("B", 1, click(0.1, 0.1), app="yelp", subsplits=["IDD", "app_unseen"]),
            _step("B", 2, Action(type="press", button="back"), app="yelp", subsplits=["IDD", "app_unseen"]),
            _step("B", 3, Action(type="stop"), app="yelp", subsplits=["IDD", "app_unseen"]),
        ),
    )
    c = Episode(
        "C",
        "goal",
        (
            _step("C", 0, Action(type="press", button="home"), app="yelp", subsplits=["task_unseen"]),
            _step("C", 1, Action(type="type", text="x"), app="yelp", subsplits=["task_unseen"]),
        ),
    )
    preds = {
        ("A", 0): click(0.55, 0.48),
        ("A", 1): Action(type="type", text="Hello"),
        ("A", 2): Action(type="stop"),
        ("B", 0): Action(type="scroll", direction="up"),
        ("B", 1): click(0.9, 0.9),  # type match, far: miss
        ("B", 2): Action(type="press", button="back"),
        ("B", 3): Action(type="stop"),
        ("C", 0): parse_action("garbage"),
        ("C", 1): Action(type="type", text="x"),
    }
    return [a, b, c], preds


def test_table_aggregation_known_answers():
    episodes, preds = fixture_episodes()
    t = score_episodes(episodes, preds, "aitz")
    assert t["total"] == {"count": 9, "type_acc": pytest.approx(8 / 9), "exact_acc": pytest.approx(7 / 9)}
    assert t["CLICK"] == {"count": 2, "type_acc": 1.0, "exact_acc": 0.5}
    assert t["TYPE"] == {"count": 2, "type_acc": 1.0, "exact_acc": 1.0}
    assert t["SCROLL"] == {"count": 1, "type_acc": 1.0, "exact_acc": 1.0}
    assert t["PRESS"] == {"count": 2, "type_acc": 0.5, "exact_acc": 0.5}
    assert t["STOP"] == {"count": 2, "type_acc": 1.0, "exact_acc": 1.0}
    assert t["parse_rate"] == pytest.approx(8 / 9)
    assert t["episode_success"] == pytest.approx(1 / 3)
    assert t["goal_progress"] == pytest.approx((1 + 1 / 4 + 0) / 3)
    assert (t["steps"], t["episodes"], t["rules"]) == (9, 3, "aitz")
    assert "subsplits" not in t and "apps" not in t
    text = format_table(t)
    assert "CLICK" in text and " 77.78" in text


def test_missing_prediction_is_a_miss():
    episodes, preds = fixture_episodes()
    del preds[("A", 2)]
    t = score_episodes(episodes, preds, "aitz")
    assert t["total"]["exact_acc"] == pytest.approx(6 / 9)
    assert t["parse_rate"] == pytest.approx(7 / 9)
    assert t["episode_success"] == 0.0
    assert t["goal_progress"] == pytest.approx((2 / 3 + 1 / 4 + 0) / 3)


def test_android_control_subsplits_and_grounding():
    episodes, preds = fixture_episodes()
    t = score_episodes(episodes, preds, "androidcontrol")
    assert t["grounding"] == 0.5  # 2 click type matches, 1 exact
    sub = t["subsplits"]
    assert set(sub) == {"IDD", "app_unseen", "task_unseen"}
    assert sub["IDD"] == {"count": 7, "type_acc": 1.0, "step_acc": pytest.approx(6 / 7), "grounding": 0.5}
    assert sub["app_unseen"] == {"count": 4, "type_acc": 1.0, "step_acc": 0.75, "grounding": 0.0}
    assert sub["task_unseen"] == {"count": 2, "type_acc": 0.5, "step_acc": 0.5, "grounding": None}


def test_amex_per_app():
    episodes, preds = fixture_episodes()
    t = score_episodes(episodes, preds, "amex")
    assert t["apps"] == {
        "gmail": {"count": 3, "type_acc": 1.0, "step_acc": 1.0},
        "yelp": {"count": 6, "type_acc": pytest.approx(5 / 6), "step_acc": pytest.approx(4 / 6)},
    }


def test_golden_predictions_score_full_and_garbage_scores_zero():
    episodes, _ = fixture_episodes()
    golden = {(s.episode_id, s.step_id): s.action for ep in episodes for s in ep.steps}
    for fmt in ("aitz", "amex", "androidcontrol"):
        t = score_episodes(episodes, golden, fmt)
        for key in ("total", "CLICK", "TYPE", "SCROLL", "PRESS", "STOP"):
            assert t[key]["type_acc"] == 1.0 and t[key]["exact_acc"] == 1.0, (fmt, key)
        assert t["parse_rate"] == t["episode_success"] == t["goal_progress"] == 1.0
    garbage = {k: parse_action("lorem ipsum") for k in golden}
    t = score_episodes(episodes, garbage, "aitz")
    assert t["total"] == {"count": 9, "type_acc": 0.0, "exact_acc": 0.0}
    assert t["parse_rate"] == t["episode_success"] == t["goal_progress"] == 0.0


def test_empty_type_rows_are_none():
    ep = Episode("A", "g", (_step("A", 0, Action(type="stop")),))
    t = score_episodes([ep], {}, "aitz")
    assert t["CLICK"] == {"count": 0, "type_acc": None, "exact_acc": None}
    assert "-" in format_table(t)
