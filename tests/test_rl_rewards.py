"""UI-R1's rule reward, DAST and NaN-safe group advantages: known answers computed by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.coat.actions import Action, invalid_action
from ipl_jax.coat.rewards import encode_actions, reshape_leading
from ipl_jax.data.records import Step
from ipl_jax.rl import rewards as R


def _step(action, i=0):
    return Step(episode_id="7", step_id=i, instruction="x", image=b"", screen_size=(200, 400), action=action)


GOLDEN = [
    _step(Action("click", point=(0.2, 0.15), box=(0.1, 0.1, 0.3, 0.2), target="OK"), 0),
    _step(Action("type", text="hello world"), 1),
    _step(Action("scroll", direction="up"), 2),
    _step(Action("stop"), 3),
    _step(Action("click", point=(0.5, 0.5)), 4),  # a golden point without a box
]
# per golden: (prediction, format ok, expected (r_type, r_coord, r_format))
CASES = [
    [
        (Action("click", point=(0.25, 0.12)), True, (1, 1, 1)),  # inside the box
        (Action("click", point=(0.35, 0.15)), True, (1, 0, 1)),  # outside (0.05 from the edge)
        (Action("click", target="OK"), False, (1, 0, 0)),  # grounding did not parse
        (Action("scroll", direction="up"), True, (0, 0, 1)),
        (invalid_action(), False, (0, 0, 0)),
    ],
    [
        (Action("type", text="hello world"), True, (1, 1, 1)),
        (Action("type", text="bye"), True, (1, 0, 1)),
        (Action("press", button="enter"), True, (0, 0, 1)),
        (Action("type", text="hello"), False, (1, 1, 0)),  # AITZ's "contains" rule
        (invalid_action(), True, (0, 0, 1)),
    ],
    [
        (Action("scroll", direction="up"), True, (1, 1, 1)),
        (Action("scroll", direction="down"), True, (1, 0, 1)),
        (Action("stop"), True, (0, 0, 1)),
        (Action("scroll", direction="up"), False, (1, 1, 0)),
        (Action("click", point=(0.5, 0.5)), False, (0, 0, 0)),
    ],
    [
        (Action("stop"), True, (1, 1, 1)),
        (Action("stop"), False, (1, 1, 0)),
        (Action("wait"), True, (0, 0, 1)),
        (Action("press", button="back"), True, (0, 0, 1)),
        (invalid_action(), False, (0, 0, 0)),
    ],
    [
        (Action("click", point=(0.6, 0.5)), True, (1, 1, 1)),  # 0.10 <= 0.14
        (Action("click", point=(0.7, 0.5)), True, (1, 0, 1)),  # 0.20
        (Action("click", point=(0.5, 0.62)), True, (1, 1, 1)),  # 0.12
        (Action("long_press", point=(0.5, 0.5)), True, (0, 0, 1)),
        (Action("click"), True, (1, 0, 1)),
    ],
]


def test_uir1_reward_known_answers():
    preds = [a for row in CASES for a, _, _ in row]
    fmt = np.array([[ok for _, ok, _ in row] for row in CASES])
    want = np.array([[w for _, _, w in row] for row in CASES], np.float32)  # [5, 5, 3]
    pred = reshape_leading(encode_actions(preds), (5, 5))
    r = R.uir1_rewards(pred, jnp.asarray(fmt), R.encode_uir1_golden(GOLDEN))
    np.testing.assert_array_equal(np.asarray(r.r_type), want[..., 0])
    np.testing.assert_array_equal(np.asarray(r.r_coord), want[..., 1])
    np.testing.assert_array_equal(np.asarray(r.r_format), want[..., 2])
    np.testing.assert_array_equal(np.asarray(r.total), want.sum(-1))
    np.testing.assert_array_equal(np.asarray(r.correct), (want[..., 0] * want[..., 1]) > 0)
    assert float(np.max(np.asarray(r.total))) == 3.0 and float(np.min(np.asarray(r.r_length))) == 0.0


def test_dast_in_group_rewards_uses_the_group_share_of_correct_samples():
    correct = jnp.array([[True, False, False, False], [False, False, False, False]])
    ones = jnp.ones((2, 4))
    base = R.UIR1Rewards(
        r_type=ones,
        r_coord=correct.astype(jnp.float32),
        r_format=ones,
        r_length=0 * ones,
        total=2 * ones + correct,
        correct=correct,
    )
    lengths = jnp.array([[10, 20, 30, 40], [10, 50, 50, 50]])
    r = R.group_rewards(base, lengths, max_length=50.0, dast=True)
    # group 0: p = 1/4, mean correct length 10 -> budget 0.25*10 + 0.75*50 = 40; λ = (L - 40) / 40
    # group 1: nobody correct -> p = 0, budget = L_max = 50
    want = [
        [
            max(-0.5 * -0.75 + 0.5, 0.1),
            min(0.9 * -0.5 - 0.1, -0.1),
            min(0.9 * -0.25 - 0.1, -0.1),
            min(0.9 * 0.0 - 0.1, -0.1),
        ],
        [min(0.9 * -0.8 - 0.1, -0.1), -0.1, -0.1, -0.1],
    ]
    np.testing.assert_allclose(np.asarray(r.r_length), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r.total), np.asarray(base.total) + np.array(want), rtol=1e-6)
    assert R.group_rewards(base, lengths, 50.0, dast=False) is base


def test_group_advantages_never_nan():
    r = jnp.array(
        [
            [1.0, 0.0, 1.0, 0.0],
            [0.1, 0.1, 0.1, 0.1],  # equal rewards (0.1 is not exact in binary): zero, never ±0.00x
            [1.0, np.nan, 0.0, 2.0],  # a non-finite reward: the group gives no signal
            [3.0, 1.0, 7.0, 7.0],
        ]
    )  # the last two are padding
    valid = jnp.array([[True] * 4, [True] * 4, [True] * 4, [True, True, False, False]])
    a = np.asarray(R.safe_group_advantages(r, valid))
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a[0], np.array([1, -1, 1, -1]) * 0.5 / 0.5001, rtol=1e-6)
    np.testing.assert_array_equal(a[1], 0.0)
    np.testing.assert_array_equal(a[2], 0.0)
    np.testing.assert_allclose(a[3], [1 / 1.0001, -1 / 1.0001, 0, 0], rtol=1e-6)
    single = np.asarray(R.safe_group_advantages(jnp.array([[5.0, 1.0]]), jnp.array([[True, False]])))
    np.testing.assert_array_equal(single, 0.0)


def test_think_answer_format_and_parsing():
    a, ok = R.parse_think_answer("<think>the switch is off</think> <answer>click Wi-Fi (500,120)</answer>")
    assert ok and a.type == "click" and a.target == "Wi-Fi" and a.point == pytest.approx((0.5, 0.12))
    a, ok = R.parse_think_answer("<think>t</think><answer>click OK (100,100),(300,200)</answer>\n")
    assert ok and a.point == pytest.approx((0.2, 0.15)) and a.target == "OK"
    a, ok = R.parse_think_answer("<think>t</think><answer>scroll down</answer> and more")
    assert not ok and a == Action("scroll", direction="down")
    a, ok = R.parse_think_answer('<answer>type "hi (there)"</answer>')
    assert not ok and a == Action("type", text="hi (there)")
    for bad in ("click OK", "<think>x</think>", "", None, "<answer>fly away</answer>"):
        a, ok = R.parse_think_answer(bad)
        assert not a.parsed and not ok
    assert R.think_answer_format_ok("<think>\na\n</think>\n<answer>stop</answer>")
    assert not R.think_answer_format_ok("<think>a</think><answer>stop</answer><answer>x</answer>x")


def test_coat_format_reward():
    box = "<|box_start|>(100,100),(300,200)<|box_end|>"
    assert R.coat_format_ok("click OK", box, (True, True, True, True))
    assert not R.coat_format_ok("click OK", box, (True, True, True, False))  # grounding cut at its budget
    assert not R.coat_format_ok("click OK", "somewhere", (True,) * 4)
    assert R.coat_format_ok("scroll up", "garbage", (True, True, True, False))  # s4 is not part of a scroll
    assert not R.coat_format_ok("scroll up", "", (True, False, True, True))
    assert not R.coat_format_ok("fly to the moon", box, (True,) * 4)
    assert math.isfinite(float(R.UIR1RewardConfig().click_radius))
