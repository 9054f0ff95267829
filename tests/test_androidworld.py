"""The AndroidWorld client: the action mapping both ways, screenshot decoding, and the client against a stand-in
server on localhost that serves the synthetic world through AndroidWorld's HTTP API (tests/support/aw_server.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ipl_jax.coat.actions import Action
from ipl_jax.envs.androidworld import client as aw_client
from ipl_jax.envs.androidworld.actions import from_json_action, to_fraction, to_json_action, to_pixel
from ipl_jax.envs.androidworld.env import AndroidWorldEnv, check, open, suite_tasks
from ipl_jax.envs.androidworld.screens import decode_pixels
from ipl_jax.envs.protocol import EnvError
from ipl_jax.envs.synthetic.expert import expert_decision
from ipl_jax.envs.synthetic.world import World
from tests.support.aw_server import TASK_TYPES, SyntheticAndroidWorld, synthetic_task

SIZE = (1080, 2400)

# ---------------------------------------------------------------------------------------------- action mapping

OURS_TO_AW = [
    (Action(type="click", point=(0.5, 0.25)), {"action_type": "click", "x": 540, "y": 600}),
    (Action(type="click", box=(0.1, 0.1, 0.3, 0.2)), {"action_type": "click", "x": 216, "y": 360}),
    (Action(type="click", point=(1.0, 1.0)), {"action_type": "click", "x": 1079, "y": 2399}),
    (Action(type="click"), {"action_type": "unknown"}),
    (Action(type="long_press", point=(0.25, 0.5)), {"action_type": "long_press", "x": 270, "y": 1200}),
    (Action(type="type", text="hello"), {"action_type": "input_text", "text": "hello"}),
    (
        Action(type="type", text="hi", point=(0.5, 0.5)),
        {"action_type": "input_text", "text": "hi", "x": 540, "y": 1200},
    ),
    (Action(type="scroll", direction="up"), {"action_type": "scroll", "direction": "down"}),
    (Action(type="scroll", direction="down"), {"action_type": "scroll", "direction": "up"}),
    (Action(type="scroll", direction="left"), {"action_type": "scroll", "direction": "right"}),
    (Action(type="scroll", direction="right"), {"action_type": "scroll", "direction": "left"}),
    (Action(type="press", button="back"), {"action_type": "navigate_back"}),
    (Action(type="press", button="home"), {"action_type": "navigate_home"}),
    (Action(type="press", button="enter"), {"action_type": "keyboard_enter"}),
    (Action(type="stop"), {"action_type": "status", "goal_status": "complete"}),
    (Action(type="stop", status="impossible"), {"action_type": "status", "goal_status": "infeasible"}),
    (Action(type="open_app", text="Settings"), {"action_type": "open_app", "app_name": "Settings"}),
    (Action(type="wait"), {"action_type": "wait"}),
    (Action(type="invalid", parsed=False), {"action_type": "unknown"}),
]


@pytest.mark.parametrize("ours, theirs", OURS_TO_AW)
def test_our_actions_map_to_androidworld_json(ours, theirs):
    assert to_json_action(ours, SIZE) == theirs


AW_TO_OURS = [
    ({"action_type": "click", "x": 540, "y": 600}, Action(type="click", point=(540.5 / 1080, 600.5 / 2400))),
    ({"action_type": "double_tap", "x": 0, "y": 0}, Action(type="click", point=(0.5 / 1080, 0.5 / 2400))),
    ({"action_type": "long_press", "x": 1, "y": 2}, Action(type="long_press", point=(1.5 / 1080, 2.5 / 2400))),
    ({"action_type": "click", "index": 3}, Action(type="invalid", parsed=False)),
    ({"action_type": "input_text", "text": "hi"}, Action(type="type", text="hi")),
    (
        {"action_type": "input_text", "text": "hi", "x": 9, "y": 19},
        Action(type="type", text="hi", point=(9.5 / 1080, 19.5 / 2400)),
    ),
    ({"action_type": "input_text", "text": "hi", "index": 2}, Action(type="invalid", parsed=False)),
    ({"action_type": "scroll", "direction": "down"}, Action(type="scroll", direction="up")),
    ({"action_type": "scroll", "direction": "up"}, Action(type="scroll", direction="down")),
    ({"action_type": "scroll", "direction": "left"}, Action(type="scroll", direction="right")),
    ({"action_type": "scroll", "direction": "right"}, Action(type="scroll", direction="left")),
    ({"action_type": "scroll", "direction": "down", "index": 4}, Action(type="invalid", parsed=False)),
    ({"action_type": "swipe", "direction": "up"}, Action(type="scroll", direction="up")),
    ({"action_type": "swipe", "direction": "left"}, Action(type="scroll", direction="left")),
    ({"action_type": "navigate_back"}, Action(type="press", button="back")),
    ({"action_type": "navigate_home"}, Action(type="press", button="home")),
    ({"action_type": "keyboard_enter"}, Action(type="press", button="enter")),
    ({"action_type": "status", "goal_status": "complete"}, Action(type="stop", status="complete")),
    ({"action_type": "status", "goal_status": "infeasible"}, Action(type="stop", status="impossible")),
    ({"action_type": "open_app", "app_name": "Clock"}, Action(type="open_app", text="Clock")),
    ({"action_type": "wait"}, Action(type="wait")),
    ({"action_type": "answer", "text": "42"}, Action(type="invalid", text="42", parsed=False)),
    ({"action_type": "unknown"}, Action(type="invalid", parsed=False)),
    ({"action_type": "click"}, Action(type="invalid", parsed=False)),
]


@pytest.mark.parametrize("theirs, ours", AW_TO_OURS)
def test_androidworld_json_maps_to_our_actions(theirs, ours):
    assert from_json_action(theirs, SIZE) == ours


def test_pixels_and_fractions_round_trip():
    for x, y in [(0, 0), (1079, 2399), (333, 1777)]:
        assert to_pixel(*to_fraction(x, y, SIZE), SIZE) == (x, y)
    for ours, _ in OURS_TO_AW:  # a played action read back is the same action (points: the same pixel)
        back = from_json_action(to_json_action(ours, SIZE), SIZE)
        if ours.type in ("click", "long_press", "type") and ours.parsed and back.point is not None:
            assert back.type == ours.type and to_pixel(*back.point, SIZE) == to_pixel(
                *(ours.point or (0.2, 0.15)), SIZE
            )
        elif ours.type in ("scroll", "press", "open_app", "wait"):
            assert back == ours


# ---------------------------------------------------------------------------------------------- screenshots


@pytest.mark.parametrize("shape, separators", [((7, 5, 3), (",", ":")), ((4, 9, 3), (", ", ": ")), ((3, 2, 4), None)])
def test_decode_pixels_equals_the_array(shape, separators):
    arr = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    arr[0, 0] = (0, 255, 9)[: shape[2]] if shape[2] == 3 else (0, 255, 9, 7)
    body = json.dumps({"pixels": arr.tolist()}, separators=separators).encode()
    out = decode_pixels(body)
    assert out.dtype == np.uint8 and np.array_equal(out, arr[:, :, :3])


@pytest.mark.parametrize(
    "body",
    [
        b'{"pixels":[[[1,2,3],[4,5,6]],[[7,8,9]]]}',  # ragged
        b'{"pixels":[[[1,2,300]]]}',
        b'{"pixels":[[[1,2,-3]]]}',
        b'{"pixels":[[1,2,3]]}',
        b'{"detail":"Internal Server Error"}',
        b"not json",
    ],
)
def test_decode_pixels_rejects_what_is_not_a_screen(body):
    with pytest.raises(ValueError, match="^screenshot: "):
        decode_pixels(body)


# ---------------------------------------------------------------------------------------------- over HTTP


@pytest.fixture
def server():
    s = SyntheticAndroidWorld().start()
    yield s
    s.kill()


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(aw_client, "RETRY_PAUSE", 0.0)


def _play_expert(env: AndroidWorldEnv, task, seed: int) -> tuple[int, int, float]:
    """Play the scripted expert through ``env`` (a shadow World beside it decides); (steps via env, steps on the
    World directly, score). Every screenshot through the server equals the World's own picture."""
    world_seed, synth, cfg = synthetic_task(seed, *task.spec)
    shadow = World(world_seed, cfg)
    shadow.reset(synth)
    obs = env.reset(task)
    assert obs.goal == synth.instruction and obs.step == 0
    ended, direct = False, 0
    while not ended:
        assert np.array_equal(np.asarray(obs.image), np.asarray(shadow.screen.image.convert("RGB")))
        action = expert_decision(shadow, synth).action
        ended = env.act(action)
        _, done = shadow.step(action)
        direct += 1
        assert ended == done or env.steps == task.step_limit
        obs = env.observe()
    return env.steps, direct, env.score()


def test_expert_through_the_server_scores_as_on_the_world(server):
    (env,) = open([server.url], timeout=10, retries=0)
    tasks = suite_tasks([server.url], seed=7, n_task_combinations=1)
    assert [t.spec for t in tasks] == [(t, 0) for t in TASK_TYPES] and tasks[0].name == f"{TASK_TYPES[0]}/0"
    for task in tasks:
        steps, direct, score = _play_expert(env, task, seed=7)
        assert (steps, score) == (direct, 1.0)
        env.close()
    kinds = {a["action_type"] for a in server.actions}
    assert {"click", "input_text", "scroll", "status"} <= kinds
    assert server.requests[-1] == "POST /task/tear_down"


def test_suite_names_filter_and_unknown_names(server):
    tasks = suite_tasks([server.url], names=["toggle", "install"], n_task_combinations=2, step_limit=12)
    assert [(t.name, t.step_limit, t.family) for t in tasks] == [
        ("toggle/0", 12, "toggle"),
        ("toggle/1", 12, "toggle"),
        ("install/0", 12, "install"),
        ("install/1", 12, "install"),
    ]
    with pytest.raises(EnvError, match=r"^--tasks: NoSuchTask, Nope not in the android_world suite of http") as e:
        suite_tasks([server.url], names=["toggle", "NoSuchTask", "Nope"])
    assert "\n" not in str(e.value)
    with pytest.raises(EnvError, match="HTTP 400: Invalid task family: minigolf"):
        suite_tasks([server.url], family="minigolf")


def test_an_unreachable_server_is_one_line_naming_the_url(server):
    url = server.url
    server.kill()
    with pytest.raises(EnvError) as e:
        check(url)
    assert str(e.value).startswith(f"AndroidWorld server {url} is not reachable") and "\n" not in str(e.value)
    with pytest.raises(EnvError, match="not an http"):
        open(["localhost:5000"])


def test_a_hung_request_fails_after_its_timeout_and_retries(server, fast_retries):
    env = AndroidWorldEnv(server.url, timeout=0.3, retries=1)
    task = suite_tasks([server.url], names=["toggle"])[0]
    env.reset(task)
    server.hang["/screenshot"] = 2.0
    with pytest.raises(EnvError) as e:
        env.observe()
    assert str(e.value) == f"{server.url}/screenshot: timed out (after 2 of 2 tries)"
    assert server.requests.count("GET /screenshot") == 3  # the one at reset, then two tries


def test_an_action_that_timed_out_is_not_played_twice(server, fast_retries):
    env = AndroidWorldEnv(server.url, timeout=0.3, retries=3)
    env.reset(suite_tasks([server.url], names=["toggle"])[0])
    server.hang["/execute_action"] = 1.0
    with pytest.raises(EnvError, match=r"/execute_action: timed out \(after 1 of 4 tries\)"):
        env.act(Action(type="wait"))


def test_a_killed_server_fails_only_its_own_episode(fast_retries):
    a, b = SyntheticAndroidWorld().start(), SyntheticAndroidWorld().start()
    try:
        envs = open([a.url, b.url], timeout=5, retries=1)
        task = suite_tasks([a.url, b.url], names=["open_app"])[0]
        for env in envs:
            env.reset(task)
        a.kill()
        with pytest.raises(EnvError) as dead:
            envs[0].act(Action(type="press", button="home"))
        assert str(dead.value) == f"{a.url}/execute_action: connection refused (after 2 of 2 tries)"
        assert envs[1].act(Action(type="press", button="home")) is False
        _, synth, _ = synthetic_task(30, *task.spec)
        assert envs[1].act(Action(type="open_app", text=synth.app)) is False
        assert envs[1].act(Action(type="stop")) is True and envs[1].score() == 1.0
        envs[1].close()
    finally:
        a.kill()
        b.kill()


def test_a_task_that_fails_to_initialise(server):
    server.fail_init = {"install"}
    env = AndroidWorldEnv(server.url, timeout=5, retries=0)
    task = suite_tasks([server.url], names=["install"])[0]
    with pytest.raises(EnvError, match=r"task 'install/0' failed to initialise .*HTTP 500"):
        env.reset(task)
    with pytest.raises(EnvError, match="no episode"):
        env.observe()


def test_an_action_the_device_cannot_play_is_not_fatal(server, monkeypatch):
    env = AndroidWorldEnv(server.url, timeout=5, retries=0)
    env.reset(suite_tasks([server.url], names=["toggle"])[0])

    def refuse(d):
        raise ValueError("No app name provided")

    monkeypatch.setattr(server, "_world_actions", refuse)
    assert env.act(Action(type="open_app", text="Nowhere")) is False
    assert env.steps == 1 and "No app name provided" in env.last_error
