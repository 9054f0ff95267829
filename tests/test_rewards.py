"""Known-answer tests for the leaf reward kernel and the value backup, and parity with metrics.py."""

import collections
import random
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.coat.actions import Action, parse_action
from ipl_jax.coat.metrics import match_step
from ipl_jax.coat.metrics import token_f1 as host_token_f1
from ipl_jax.coat.rewards import (
    RewardConfig,
    backup_values,
    encode_actions,
    encode_golden,
    leaf_rewards,
    reshape_leading,
    token_f1,
    word_id,
)
from ipl_jax.data.records import Step, UIElement

BOX = UIElement(box=(0.4, 0.4, 0.6, 0.5), text="OK")


def step(action, elements=(), screen=(1080, 2400), ep="e", i=0):
    return Step(ep, i, "goal", b"", screen, action, elements=elements)


def values(preds, gold_step, config=None):
    config = RewardConfig() if config is None else config
    """Leaf values (and exact flags) of predictions against one golden step, broadcast over a [1, N] batch."""
    n = len(preds)
    padded = list(preds) + [None] * (8 - n)  # one leaf shape for every test: one compilation per config
    p = reshape_leading(encode_actions(padded), (1, 8))
    out = leaf_rewards(p, encode_golden([gold_step]), config)
    return np.asarray(out.value)[0, :n], np.asarray(out.exact)[0, :n]


def click(x, y):
    return Action(type="click", point=(x, y))


def test_click_branches():
    gold = step(click(0.2, 0.2))
    preds = [
        click(0.25, 0.2),  # 0.05 away: exact -> 1
        click(0.2, 0.8),  # 0.6 away: 0.1 + 0.1 + 0.8 * 0.4 = 0.52
        click(1.0, 1.0),  # 1.131 away, clipped to 1: 0.1 + 0.1 + 0 = 0.2
        parse_action("click OK", "no grounding"),  # type right, point unparsable: v_type only
        Action(type="scroll", direction="up"),  # wrong type: 0
        parse_action("lorem ipsum"),  # unparsable: 0
        None,  # missing: 0
    ]
    v, exact = values(preds, gold)
    np.testing.assert_allclose(v, [1.0, 0.52, 0.2, 0.1, 0.0, 0.0, 0.0], atol=1e-6)
    assert exact.tolist() == [True, False, False, False, False, False, False]


def test_click_box_rule_gives_one_far_away():
    gold = step(click(0.39, 0.40), [BOX])
    v, exact = values([click(0.615, 0.505), click(0.63, 0.45)], gold)
    assert exact.tolist() == [True, False]
    d = np.hypot(0.63 - 0.39, 0.45 - 0.40)
    np.testing.assert_allclose(v, [1.0, 0.2 + 0.8 * (1 - d)], atol=1e-6)
    # the older matcher's x2.4 boxes take the second one too
    v, exact = values([click(0.63, 0.45)], gold, RewardConfig(rules="aitw"))
    assert exact.tolist() == [True] and v[0] == 1.0


def test_type_branches_and_f1():
    gold = step(Action(type="type", text="new york city"))
    preds = [
        Action(type="type", text="New York City "),  # exact (contains)
        Action(type="type", text="york city"),  # contained: exact under the AITZ rule
        Action(type="type", text="boston city"),  # F1 = 2·(1/2·1/3)/(1/2+1/3) = 0.4
        Action(type="type", text="paris"),  # F1 0
        Action(type="type", text=""),  # empty prediction: not contained, F1 0
        Action(type="type"),  # no text: v_type only
    ]
    v, exact = values(preds, gold)
    np.testing.assert_allclose(v, [1.0, 1.0, 0.2 + 0.8 * 0.4, 0.2, 0.2, 0.1], atol=1e-6)
    assert exact.tolist() == [True, True, False, False, False, False]
    # under OS-Atlas rules "york city" (F1 0.8 > 0.5) is exact, "york" (F1 0.5) is not: 0.2 + 0.8 * 0.5
    v, exact = values(
        [Action(type="type", text="york city"), Action(type="type", text="york")],
        gold,
        RewardConfig(rules="androidcontrol"),
    )
    assert exact.tolist() == [True, False]
    np.testing.assert_allclose(v, [1.0, 0.6], atol=1e-6)


def test_other_types_get_type_reward_only():
    v, _ = values(
        [
            Action(type="scroll", direction="up"),
            Action(type="scroll", direction="down"),
            Action(type="press", button="back"),
        ],
        step(Action(type="scroll", direction="up")),
    )
    np.testing.assert_allclose(v, [1.0, 0.1, 0.0])
    v, _ = values(
        [Action(type="press", button="back"), Action(type="press", button="home"), Action(type="stop")],
        step(Action(type="press", button="back")),
    )
    np.testing.assert_allclose(v, [1.0, 0.1, 0.0])
    v, _ = values(
        [Action(type="stop"), Action(type="stop", status="impossible"), click(0.1, 0.1)], step(Action(type="stop"))
    )
    np.testing.assert_allclose(v, [1.0, 1.0, 0.0])
    # long_press is a point action for "exact" but has no distance term
    v, _ = values(
        [Action(type="long_press", point=(0.5, 0.5)), Action(type="long_press", point=(0.9, 0.9))],
        step(Action(type="long_press", point=(0.5, 0.52))),
    )
    np.testing.assert_allclose(v, [1.0, 0.1])


def test_config_weights():
    gold = step(click(0.2, 0.2))
    cfg = RewardConfig(v_type=0.2, v_format=0.3)
    v, _ = values([click(0.2, 0.7), parse_action("click x")], gold, cfg)
    np.testing.assert_allclose(v, [0.2 + 0.3 + 0.5 * 0.5, 0.2], atol=1e-6)
    with pytest.raises(ValueError):
        RewardConfig(v_type=0.6, v_format=0.5)
    with pytest.raises(ValueError):
        RewardConfig(rules="nope")


def test_token_f1_kernel_known_values():
    def enc(s, n=6):
        ids = [word_id(w) for w in s.lower().split()]
        return np.array(ids + [0] * (n - len(ids)), np.int32), len(ids)

    cases = [("a b b", "b b c"), ("new york", "new york city"), ("", ""), ("a", ""), ("x y", "y x"), ("a a a", "a")]
    p = np.stack([enc(a)[0] for a, _ in cases])
    pl = np.array([enc(a)[1] for a, _ in cases])
    g = np.stack([enc(b)[0] for _, b in cases])
    gl = np.array([enc(b)[1] for _, b in cases])
    got = np.asarray(jax.jit(token_f1)(jnp.asarray(p), jnp.asarray(pl), jnp.asarray(g), jnp.asarray(gl)))
    np.testing.assert_allclose(got, [2 / 3, 0.8, 1.0, 0.0, 1.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(got, [host_token_f1(a, b) for a, b in cases], atol=1e-6)


def test_tree_shaped_batch_broadcasts_golden():
    """Leaves [B=2, 3, 3, 3, 1] against golden [2]: each tree is scored against its own golden action."""
    golds = [step(click(0.2, 0.2)), step(Action(type="type", text="hi"))]
    rng = random.Random(1)
    leaves = [
        click(rng.random(), rng.random()) if rng.random() < 0.5 else Action(type="type", text="hi there")
        for _ in range(2 * 27)
    ]
    p = reshape_leading(encode_actions(leaves), (2, 3, 3, 3, 1))
    out = leaf_rewards(p, encode_golden(golds))
    assert out.value.shape == (2, 3, 3, 3, 1)
    flat = np.asarray(out.value).reshape(2, 27)
    for b in range(2):
        single = np.asarray(
            leaf_rewards(encode_actions(leaves[b * 27 : (b + 1) * 27]), encode_golden([golds[b]] * 27)).value
        )
        np.testing.assert_allclose(flat[b], single, atol=1e-6)


def _random_action(rng, texts):
    kind = rng.choice(
        ["click", "click", "long_press", "type", "type", "scroll", "press", "stop", "invalid", "open_app"]
    )
    if kind in ("click", "long_press"):
        if rng.random() < 0.1:
            return Action(type=kind)
        return Action(type=kind, point=(rng.random(), rng.random()))
    if kind in ("type", "open_app"):
        return Action(type=kind, text=rng.choice(texts))
    if kind == "scroll":
        return Action(type="scroll", direction=rng.choice(["up", "down", "left", "right"]))
    if kind == "press":
        return Action(type="press", button=rng.choice(["back", "home", "enter"]))
    if kind == "stop":
        return Action(type="stop")
    return parse_action("???")


def _random_step(rng, texts, i):
    action = _random_action(rng, texts)
    while not action.parsed or (action.type in ("click", "long_press") and action.point is None):
        action = _random_action(rng, texts)
    elements = []
    for _ in range(rng.randrange(0, 4)):
        x, y = rng.random() * 0.8, rng.random() * 0.9
        elements.append(
            UIElement(box=(x, y, x + rng.random() * 0.3, y + rng.random() * 0.1), clickable=rng.random() < 0.6)
        )
    if action.type in ("click", "long_press") and rng.random() < 0.7:
        gx, gy = action.point
        for _ in range(rng.randrange(1, 4)):  # boxes near the golden point, wide rows among them
            w, h = rng.choice([rng.uniform(0.05, 0.3), rng.uniform(0.6, 1.0)]), rng.uniform(0.02, 0.15)
            x1, y1 = gx - rng.uniform(-0.1, 1.1) * w, gy - rng.uniform(-0.1, 1.1) * h
            elements.append(
                UIElement(
                    box=(max(0.0, x1), max(0.0, y1), min(1.0, x1 + w), min(1.0, y1 + h)), clickable=rng.random() < 0.6
                )
            )
        rng.shuffle(elements)
    return step(action, tuple(elements), screen=rng.choice([(1080, 2400), (1000, 1000), (720, 1280)]), i=i)


def _prediction_for(rng, s, texts):
    """A prediction biased towards the golden type, and for points towards the golden boxes."""
    kind = s.action.type
    if kind in ("click", "long_press") and rng.random() < 0.7:
        if s.elements and rng.random() < 0.5:  # anywhere in (or just around) one of the golden boxes
            x1, y1, x2, y2 = rng.choice(s.elements).box
            cx, cy, f = (x1 + x2) / 2, (y1 + y2) / 2, rng.uniform(0.0, 1.4) / 2
            return Action(type=kind, point=(cx + rng.uniform(-f, f) * (x2 - x1), cy + rng.uniform(-f, f) * (y2 - y1)))
        gx, gy = s.action.point
        return Action(type=kind, point=(gx + rng.gauss(0, 0.15), gy + rng.gauss(0, 0.15)))
    a = _random_action(rng, texts)
    if rng.random() < 0.5:
        while a.type != kind:
            a = _random_action(rng, texts)
    return a


@pytest.mark.parametrize("rules", ["aitz", "aitw", "amex", "androidcontrol", "androidcontrol_uir1"])
def test_exact_match_agrees_with_metrics(rules):
    rng = random.Random(zlib.crc32(rules.encode()))  # fixed per rule set
    texts = [
        "hello",
        "Hello World",
        " hello world ",
        "world",
        "new york city",
        "york",
        "",
        "a b a",
        "b a",
        "search for cats",
        "cats",
        "zürich",
        "ZÜRICH hotels",
    ]
    steps = [_random_step(rng, texts, i) for i in range(400)]
    preds = [_prediction_for(rng, s, texts) for s in steps]
    out = leaf_rewards(encode_actions(preds), encode_golden(steps), RewardConfig(rules=rules))
    want = [match_step(a, s, rules) for a, s in zip(preds, steps)]
    assert np.asarray(out.exact).tolist() == [v.exact_match for v in want]
    assert np.asarray(out.type_match).tolist() == [v.type_match for v in want]
    assert 40 < sum(v.exact_match for v in want) < 360  # both outcomes well represented
    decided_by = collections.Counter(v.details.get("rule") for v in want)
    if rules in ("aitz", "aitw", "amex"):
        assert decided_by["box"] >= 15, decided_by  # the box rule decides a fair share of the clicks
    vals = np.asarray(out.value)
    assert np.all((vals == 1.0) == np.asarray(out.exact)) and np.all((vals >= 0) & (vals <= 1))


def test_backup_known_values():
    leaves = jnp.arange(2 * 8, dtype=jnp.float32).reshape(2, 8) / 16.0  # branching (2, 2, 2, 1)
    v1, v2, v3, v4 = backup_values(leaves, (2, 2, 2, 1), discount=0.5)
    assert v4.shape == (2, 2, 2, 2, 1) and v3.shape == (2, 2, 2, 2) and v2.shape == (2, 2, 2) and v1.shape == (2, 2)
    np.testing.assert_allclose(v3[0].ravel(), 0.5 * np.arange(8) / 16.0)  # b4 = 1: one child, discounted
    np.testing.assert_allclose(v2[0].ravel(), 0.25 * np.array([0.5, 2.5, 4.5, 6.5]) / 16.0)
    np.testing.assert_allclose(v1[1], 0.125 * np.array([9.5, 13.5]) / 16.0)
    # default discount 0.95, default branching (3, 3, 3, 1): a tree of all-1 leaves
    v = backup_values(jnp.ones((1, 3, 3, 3, 1)), (3, 3, 3, 1))
    assert [x.shape for x in v] == [(1, 3), (1, 3, 3), (1, 3, 3, 3), (1, 3, 3, 3, 1)]
    np.testing.assert_allclose(v[0], 0.95**3, rtol=1e-6)
    v = backup_values(jnp.array([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]), (2, 2, 2, 1))
    np.testing.assert_allclose(v[0], [[0.95**3 * 0.25, 0.0]], rtol=1e-6)
    jitted = jax.jit(backup_values, static_argnums=(1, 2))
    np.testing.assert_allclose(jitted(leaves, (2, 2, 2, 1), 0.5)[0], v1)
    with pytest.raises(ValueError):
        backup_values(leaves, (2, 0, 2, 1))


def test_contains_kernel_at_full_width():
    from ipl_jax.coat.rewards import _contains

    def enc(s, c=4):
        return np.array([ord(ch) for ch in s] + [0] * (c - len(s)), np.int32), len(s)

    hay, hay_len = enc("abca")  # fills every slot: a window must not run past the end
    cases = [("aa", False), ("ca", True), ("abca", True), ("bc", True), ("", True), ("cab", False), ("a", True)]
    needles = np.stack([enc(n)[0] for n, _ in cases])
    lens = np.array([enc(n)[1] for n, _ in cases])
    got = jax.jit(_contains)(jnp.asarray(needles), jnp.asarray(lens), jnp.asarray(hay)[None], jnp.asarray([hay_len]))
    assert np.asarray(got).tolist() == [want for _, want in cases]
