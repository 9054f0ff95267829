import pytest

from ipl_jax.coat.actions import (
    Action,
    format_action,
    format_grounding,
    parse_action,
    parse_action_text,
    parse_grounding,
)


@pytest.mark.parametrize(
    "action",
    [
        Action("click", point=(0.5, 0.25), box=(0.4, 0.2, 0.6, 0.3), target="Wi-Fi toggle"),
        Action("long_press", target="Anna"),
        Action("type", text="red shoes"),
        Action("scroll", direction="up"),
        Action("press", button="enter"),
        Action("stop"),
        Action("open_app", text="Clock"),
        Action("wait"),
    ],
)
def test_format_then_parse_round_trips(action):
    text = format_action(action)
    grounding = format_grounding(action.box) if action.box else None
    got = parse_action(text, grounding)
    assert got.parsed and got.type == action.type
    assert got.text == action.text and got.direction == action.direction and got.button == action.button
    if action.box:
        assert got.box == pytest.approx(action.box)
        assert got.point == pytest.approx(action.point)


def test_grounding_parsing():
    assert parse_grounding("<|box_start|>(100,200),(300,400)<|box_end|>") == pytest.approx((0.1, 0.2, 0.3, 0.4))
    assert parse_grounding("(300, 400),(100,200)") == pytest.approx((0.1, 0.2, 0.3, 0.4))
    assert parse_grounding("(500,500)") == pytest.approx((0.5, 0.5, 0.5, 0.5))
    for bad in ("", "nothing", "(1200,5),(3,4)", None, 12):
        assert parse_grounding(bad) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "jump around",
        "scroll sideways",
        "press power",
        "type no quotes",
        "click",
        None,
        3.5,
        "<|im_end|>",
        "import os; os.system('x')",
    ],
)
def test_garbage_never_raises_and_is_invalid(text):
    a = parse_action_text(text)
    assert not a.parsed and a.type == "invalid"


def test_click_without_grounding_keeps_type_but_no_point():
    a = parse_action("click Search", "garbage")
    assert a.parsed and a.type == "click" and a.point is None


def test_lenient_prefixes():
    assert parse_action_text("Action: press Back.").button == "back"
    assert parse_action_text("TAP the blue icon").type == "click"
    assert parse_action_text('type "hello world"').text == "hello world"


def test_json_round_trip():
    a = Action("click", point=(0.1, 0.2), box=(0.0, 0.1, 0.2, 0.3), target="x")
    assert Action.from_json(a.to_json()) == a
