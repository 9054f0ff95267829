"""The live simulator: known-answer semantics, robustness to any action, rendering."""

import dataclasses
import math

import numpy as np
import pytest

from ipl_jax.coat.actions import Action
from ipl_jax.envs.synthetic import Task, World, WorldConfig, apply_overrides, is_done
from ipl_jax.envs.synthetic.expert import expert_decision


def _task(**kw):
    base = dict(family="toggle", instruction="Turn on Wi-Fi", template=0, setting="Wi-Fi", on=True)
    base.update(kw)
    return Task(**base)


def _tap(screen, key):
    w = screen.find(key)
    assert w is not None, key
    x1, y1, x2, y2 = screen.fraction_box(w)
    return Action(type="click", point=((x1 + x2) / 2, (y1 + y2) / 2))


def test_settings_known_answers():
    world = World(5, WorldConfig(settings_rows=(16, 16)))
    s = world.reset(_task())
    assert s.app == "Home"
    settings = world.apps["Settings"]
    assert settings.values["Wi-Fi"] is False  # a task's switch starts in the wrong state
    s, done = world.step(_tap(s, "app:Settings"))
    assert (s.app, s.page, done) == ("Settings", "main", False)
    # scroll direction is the finger's: finger up shows later rows, finger down earlier ones
    settings.list.offset = 0
    s, _ = world.step(Action(type="scroll", direction="up"))
    step = max(1, settings.list.visible - 2)
    assert settings.list.offset == min(step, settings.list.max_offset) > 0
    s, _ = world.step(Action(type="scroll", direction="down"))
    assert settings.list.offset == 0
    # sideways scrolls do nothing to a vertical list
    world.step(Action(type="scroll", direction="left"))
    assert settings.list.offset == 0
    # tapping a row flips its switch, and only that one
    while not settings.list.is_visible(settings.row_index("Wi-Fi")):
        s, _ = world.step(Action(type="scroll", direction="up"))
    before = dict(settings.values)
    s, _ = world.step(_tap(world.screen, "row:Wi-Fi"))
    assert settings.values["Wi-Fi"] is True
    assert {k: v for k, v in settings.values.items() if k != "Wi-Fi"} == {
        k: v for k, v in before.items() if k != "Wi-Fi"
    }
    assert is_done(world, _task())
    # the switch widget toggles too, and the screen shows the new state
    sw = world.screen.find("switch:Wi-Fi")
    assert sw.on is True
    world.step(_tap(world.screen, "switch:Wi-Fi"))
    assert settings.values["Wi-Fi"] is False
    # back from the main list goes home; home button goes home
    world.step(Action(type="press", button="back"))
    assert world.current == "Home"
    world.step(_tap(world.screen, "app:Settings"))
    world.step(Action(type="press", button="home"))
    assert world.current == "Home"
    # stop ends the episode; later actions are ignored
    s, done = world.step(Action(type="stop"))
    assert done
    s2, done2 = world.step(_tap(s, "app:Settings"))
    assert done2 and s2 is s and world.current == "Home"


def test_submenu_and_back():
    world = World(11)
    world.reset(_task(family="sub_toggle", setting="Dark theme", instruction="Turn on Dark theme"))
    world.step(_tap(world.screen, "app:Settings"))
    settings = world.apps["Settings"]
    while not settings.list.is_visible(settings.row_index("Display")):
        world.step(
            Action(type="scroll", direction="up" if settings.row_index("Display") >= settings.list.offset else "down")
        )
    s, _ = world.step(_tap(world.screen, "row:Display"))
    assert (s.app, s.page) == ("Settings", "Display")
    assert [w.text for w in s.element_widgets if w.key.startswith("row:")] == [
        "Dark theme",
        "Auto brightness",
        "Night light",
        "Large text",
    ]
    s, _ = world.step(Action(type="press", button="back"))
    assert (s.app, s.page) == ("Settings", "main")


def _in_app(world_seed: int, typed_name: str, app_name: str, **task):
    """(world, app): ``World(world_seed)`` reset to a task of ``task``'s fields, then ``app`` opened by the name
    ``typed_name`` (an open_app action); ``app_name``: the app's key in ``world.apps``."""
    world = World(world_seed)
    world.reset(Task(instruction="x", template=0, **task))
    world.step(Action(type="open_app", text=typed_name))
    return world, world.apps[app_name]


def test_shop_search_flow_and_typing_needs_focus():
    world, shop = _in_app(3, "shop", "Shop", family="add_to_cart", query="red shoes")
    assert world.current == "Shop"
    world.step(Action(type="type", text="red shoes"))
    assert shop.field == ""  # nothing is focused: typing goes nowhere
    world.step(Action(type="press", button="enter"))
    assert shop.page == "main"
    world.step(_tap(world.screen, "field"))
    assert shop.focused
    world.step(Action(type="type", text="Red  Shoes"))
    s, _ = world.step(Action(type="press", button="enter"))
    assert (s.page, shop.query) == ("results", "red shoes")
    first = shop.results[0]
    assert first.startswith("Red Shoes ")
    assert shop.first_result("RED shoes") == first  # results depend only on the normalised query
    s, _ = world.step(_tap(s, f"result:{first}"))
    assert (s.page, shop.item) == ("details", first)
    world.step(_tap(world.screen, "primary"))
    assert shop.cart == [first] and is_done(world, world.task)
    assert any(w.style == "toast" and w.text == "Added to cart" for w in world.screen.widgets)


def test_messages_send():
    world = World(8)
    task = Task(family="send_message", instruction="x", template=0, contact="Anna", message="hi")
    world.reset(task)
    m = world.apps["Messages"]
    world.launch("Messages")
    m.chat("Anna")
    world.step(Action(type="wait"))
    world.step(_tap(world.screen, "send"))  # empty box: nothing is sent
    assert m.sent == []
    world.step(_tap(world.screen, "field"))
    world.step(Action(type="type", text="hi"))
    world.step(_tap(world.screen, "send"))
    assert m.sent == [("Anna", "hi")] and m.field == "" and is_done(world, task)
    world.step(Action(type="type", text="x\ny\t"))  # a one-line box: control characters become spaces
    assert m.field == "x y "


def test_home_pages_swipe_left_right():
    world = World(2, WorldConfig(n_extra_apps=(22, 22)))
    world.reset(None)
    home = world.apps["Home"]
    assert home.n_pages == 2 and home.index == 0
    world.step(Action(type="scroll", direction="right"))
    assert home.index == 0
    world.step(Action(type="scroll", direction="left"))  # finger moves left: the next page
    assert home.index == 1
    shown = {w.text for w in world.screen.element_widgets if w.kind == "ICON_APP"}
    assert shown == set(home.order[home.per_page :])
    world.step(Action(type="scroll", direction="right"))
    assert home.index == 0


BAD_ACTIONS = [
    None,
    "click",
    42,
    {"type": "click"},
    Action(type="click"),
    Action(type="click", point=(1.5, 0.2)),
    Action(type="click", point=(-0.1, 0.5)),
    Action(type="click", point=(float("nan"), 0.5)),
    Action(type="click", point=(0.5,)),
    Action(type="click", point="ab"),
    Action(type="scroll"),
    Action(type="scroll", direction="sideways"),
    Action(type="type"),
    Action(type="type", text=7),
    Action(type="press"),
    Action(type="press", button="power"),
    Action(type="teleport"),
    Action(type="invalid", parsed=False),
    Action(type="open_app", text="Nope"),
    Action(type="open_app"),
    Action(type="long_press", point=(0.5, 0.5)),
    Action(type="wait"),
]


def test_random_actions_never_crash():
    rng = np.random.default_rng(0)
    world = World(123, WorldConfig(n_extra_apps=(22, 22)))
    world.reset(None)
    kinds = ("click", "click", "click", "scroll", "type", "press", "open_app", "bad", "stop")
    visited = set()
    for i in range(1000):
        s = world.screen
        k = kinds[int(rng.integers(len(kinds)))]
        if k == "click":
            els = [w for w in s.element_widgets if w.clickable]
            if els and rng.random() < 0.8:
                w = els[int(rng.integers(len(els)))]
                x1, y1, x2, y2 = s.fraction_box(w)
                a = Action(type="click", point=(float(rng.uniform(x1, x2)), float(rng.uniform(y1, y2))))
            else:
                a = Action(type="click", point=tuple(float(v) for v in rng.uniform(-0.2, 1.2, 2)))
        elif k == "scroll":
            a = Action(type="scroll", direction=["up", "down", "left", "right"][int(rng.integers(4))])
        elif k == "type":
            a = Action(
                type="type",
                text=["red shoes", "hi", "Notely", "x" * 80, "", "a\nb\t\x00", "h\u00e9 \u2713 \U0001f600"][
                    int(rng.integers(7))
                ],
            )
        elif k == "press":
            a = Action(type="press", button=["back", "home", "enter"][int(rng.integers(3))])
        elif k == "open_app":
            a = Action(type="open_app", text=["Settings", "Shop", "Messages", "Clock", "Zzz"][int(rng.integers(5))])
        elif k == "bad":
            a = BAD_ACTIONS[int(rng.integers(len(BAD_ACTIONS)))]
        else:
            a = Action(type="stop") if rng.random() < 0.2 else Action(type="wait")
        s, done = world.step(a)
        visited.add((s.app, s.page if s.app != "Settings" or s.page == "main" else "sub"))
        for k, el in enumerate(s.elements):
            assert all(0.0 <= v <= 1.0 for v in el.box) and el.box[0] < el.box[2] and el.box[1] < el.box[3]
            for other in s.elements[k + 1 :]:  # elements never overlap: a point names at most one element
                assert min(el.box[2], other.box[2]) <= max(el.box[0], other.box[0]) or min(
                    el.box[3], other.box[3]
                ) <= max(el.box[1], other.box[1]), (s.app, s.page, el, other)
        if i % 5 == 0:
            img = s.image
            assert img.size == (224, 448)
        if done:
            world.reset(None)
    # the walk got around: several apps and pages
    assert len({a for a, _ in visited}) >= 5 and len(visited) >= 8


def test_render_size_theme_and_painter_pickles():
    import pickle

    cfg = apply_overrides(WorldConfig(), ["width=252", "height=504", "themes=dark"])
    w1 = World(1, cfg)
    s = w1.reset(None)
    img = s.image
    assert img.size == (252, 504) and img.mode == "RGB"
    assert img.getpixel((126, 300))[0] < 100  # a dark background
    painter = pickle.loads(pickle.dumps(s.painter()))
    assert np.array_equal(np.asarray(painter()), np.asarray(img))
    light = World(1, dataclasses.replace(cfg, themes=("light",))).reset(None).image
    assert not np.array_equal(np.asarray(light), np.asarray(img))


def test_config_overrides_and_errors():
    cfg = apply_overrides(
        WorldConfig(), ["n_contacts=3,4", "shuffle_layout=false", "themes=rose,light", "p_start_home=0.5"]
    )
    assert cfg.n_contacts == (3, 4) and cfg.shuffle_layout is False and cfg.themes == ("rose", "light")
    for bad, word in (
        (["nope=1"], "nope"),
        (["n_contacts=3"], "n_contacts"),
        (["themes=plaid"], "plaid"),
        (["shuffle_layout=maybe"], "shuffle_layout"),
        (["task_weights=fly:1"], "fly"),
    ):
        with pytest.raises(ValueError, match=word):
            apply_overrides(WorldConfig(), bad)


def test_unshuffled_layout_is_canonical():
    cfg = WorldConfig(shuffle_layout=False, layout_jitter=False, n_extra_apps=(22, 22), settings_rows=(20, 20))
    a, b = World(1, cfg), World(2, cfg)
    a.reset(None), b.reset(None)
    assert a.apps["Home"].order == b.apps["Home"].order
    assert a.apps["Settings"].rows == b.apps["Settings"].rows
    w0, w1 = World(1), World(2)  # the default config shuffles
    w0.reset(None), w1.reset(None)
    assert w0.apps["Home"].order != w1.apps["Home"].order


def test_expert_recovers_from_every_start_state():
    for start in ("home", "other_app", "in_app"):
        for family, kw in (
            ("toggle", dict(setting="NFC", on=False)),
            ("sub_toggle", dict(setting="Badges")),
            ("install", dict(app="Lingo")),
            ("send_message", dict(contact="Kim", message="ok")),
            ("search_open", dict(query="blue hat")),
            ("open_app", dict(app="Maps")),
        ):
            task = Task(family=family, instruction="x", template=0, start=start, **kw)
            world = World(17)
            world.reset(task)
            for _ in range(25):
                _, done = world.step(expert_decision(world, task).action)
                if done:
                    break
            assert done and is_done(world, task), (start, family)
            assert math.isfinite(world.n_steps)


def test_store_install_and_shared_text_transitions():
    world, store = _in_app(4, "Store", "Store", family="install", app="Lingo")
    world.step(_tap(world.screen, "field"))
    world.step(Action(type="type", text="Lingo"))
    s, _ = world.step(Action(type="press", button="enter"))
    assert "Lingo" in store.results and s.page == "results"
    while not store.list.is_visible(store.results.index("Lingo")):
        s, _ = world.step(Action(type="scroll", direction="up"))
    s = world.screen
    # the search box and the result both read "Lingo": the transition names both effects
    assert s.transitions()["Lingo"] == "puts the cursor in the search box or opens the page of Lingo"
    s, _ = world.step(_tap(s, "result:Lingo"))
    assert s.page == "details" and s.find("primary").text == "Install"
    s, _ = world.step(_tap(s, "primary"))
    assert store.installed == {"Lingo"} and is_done(world, world.task)
    assert s.find("primary").text == "Open"
