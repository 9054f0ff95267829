"""Episodes in the live synthetic world (``rl.rollout``) and online evaluation (``eval.online``): the world and
the expert accept any parsed action, scripted stand-in policies give known outcomes, and a tiny random policy's
episodes are deterministic under a fixed key."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

pytest.importorskip("transformers")

from support import rl_setup as S

from ipl_jax.coat.actions import format_action, format_grounding, needs_grounding, parse_action
from ipl_jax.envs.protocol import replicate
from ipl_jax.envs.synthetic import env as E
from ipl_jax.envs.synthetic.env import SyntheticEnv
from ipl_jax.rl import rollout as R
from ipl_jax.rl.sampling import Completion


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return S.make_tokenizer(tmp_path_factory.mktemp("tok"))


def scripted_act(tokenizer, choose):
    """An ``act`` stand-in: ``choose(step) -> (s3, s4)`` texts, tokenised as finished turns."""

    def act(params, cfg, items, steps, seed, config, mesh=None):
        out = []
        for step in steps:
            s3, s4 = choose(step)
            texts = ["a screen", "a thought", s3, s4]
            turns = tuple(np.asarray(tokenizer.encode(t + "<|im_end|>"), np.int32) for t in texts)
            out.append(
                Completion(turns=turns, logps=tuple(np.zeros(len(t), np.float32) for t in turns), finished=(True,) * 4)
            )
        return out

    return act


def expert_choice(step):
    a = step.action
    return format_action(a), format_grounding(a.box) if needs_grounding(a) else ""


def _envs(n):
    return [SyntheticEnv() for _ in range(n)]


def _config(tok, batch_size=3):
    return R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=batch_size)


def test_world_and_expert_accept_any_parsed_action():
    """Random model-like texts, parsed, drive the world; the expert's next action exists at every state reached."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.envs.synthetic.expert import expert_decision
    from ipl_jax.envs.synthetic.world import World

    rng = np.random.default_rng(0)
    words = [
        "click",
        "tap",
        "long_press",
        "type",
        "scroll",
        "press",
        "stop",
        "open_app",
        "wait",
        "swipe",
        "Wi-Fi",
        "Shop",
        '"red hat"',
        '"x"',
        "up",
        "left",
        "back",
        "enter",
        "home",
        "Settings",
        '"Messages"',
        "(500,500)",
    ]
    tasks = E.split_world_tasks("train", 12, seed=3, config=load_settings("synthetic").world)
    tasks += E.split_world_tasks("test_task_unseen", 6, seed=3)
    applied = set()
    for wt in tasks:
        world = World(wt.spec.world_seed, wt.spec.config)
        world.reset(wt.spec.task)
        for _ in range(15):
            expert_decision(world, wt.spec.task)
            if rng.random() < 0.5:
                s3 = " ".join(rng.choice(words, size=int(rng.integers(1, 4))))
            else:
                s3 = str(
                    rng.choice(
                        [
                            'scroll up',
                            'scroll right',
                            'press back',
                            'type "blue hat"',
                            'stop',
                            'wait',
                            'open_app "Shop"',
                            'click Wi-Fi',
                            'long_press Shop',
                            'press enter',
                        ]
                    )
                )
            x1, y1 = rng.integers(-50, 1000, 2)
            s4 = f"<|box_start|>({x1},{y1}),({x1 + int(rng.integers(0, 300))},{y1 + 40})<|box_end|>"
            action = parse_action(s3, s4)
            if not action.parsed:
                continue
            applied.add(action.type)
            _, done = world.step(action)
            if done:
                break
    assert {"click", "type", "scroll", "press", "stop", "open_app", "long_press", "wait"} <= applied


def test_split_world_tasks_are_the_generated_episodes():
    from ipl_jax.envs.synthetic.dataset import generate_split

    episodes = generate_split("test_task_unseen", 3, seed=4)
    tasks = E.split_world_tasks("test_task_unseen", 3, seed=4)
    for ep, wt in zip(episodes, tasks):
        assert ep.meta["world_seed"] == wt.spec.world_seed and ep.instruction == wt.spec.task.instruction
        assert wt.step_limit == min(25, math.ceil(2 * len(ep.steps))) and wt.family == wt.spec.task.family
        assert E.expert_steps(wt.spec.world_seed, wt.spec.task, wt.spec.config) == len(ep.steps)


def test_scripted_policies_give_known_outcomes(tok, monkeypatch):
    tasks = E.split_world_tasks("train", 3, seed=1)
    expert_len = [E.expert_steps(w.spec.world_seed, w.spec.task, w.spec.config) for w in tasks]
    config = _config(tok)

    monkeypatch.setattr(R, "act", scripted_act(tok, expert_choice))
    trajs = R.rollout(None, S.make_config(tok), tok, tasks, _envs(3), jax.random.PRNGKey(0), config)
    for tr, n in zip(trajs, expert_len):
        assert tr.success and tr.stopped and not tr.truncated and tr.terminal_reward == 1.0
        assert tr.num_steps == n and np.all(tr.step_rewards == 1.0)  # every action matches the expert exactly
        assert [s.action.type for s in tr.steps] == [s.golden.type for s in tr.steps]

    monkeypatch.setattr(R, "act", scripted_act(tok, lambda step: ("fly to the moon", "")))
    trajs = R.rollout(None, S.make_config(tok), tok, tasks, _envs(3), jax.random.PRNGKey(0), config)
    for tr, wt in zip(trajs, tasks):  # unparsable: no-op steps with zero reward until the step limit
        assert tr.truncated and not tr.success and tr.num_steps == wt.step_limit and tr.terminal_reward == 0.0
        assert np.all(tr.step_rewards == 0.0) and all(np.array_equal(s.thumb, tr.steps[0].thumb) for s in tr.steps)

    monkeypatch.setattr(R, "act", scripted_act(tok, lambda step: ("stop", "")))
    summary = R.rollout_summary(
        R.rollout(None, S.make_config(tok), tok, tasks, _envs(3), jax.random.PRNGKey(0), config)
    )
    assert summary["success_rate"] == 0.0 and summary["wrong_stop_rate"] == 1.0 and summary["mean_steps"] == 1.0


def _timeless(summary):
    """A summary without its wall times (the rest is deterministic)."""
    out = {k: v for k, v in summary.items() if "wall" not in k}
    out["episodes_detail"] = [
        {k: v for k, v in e.items() if k != "wall_seconds"} for e in out.get("episodes_detail", [])
    ]
    return out


@pytest.mark.e2e
def test_online_eval_with_the_expert_and_with_a_random_policy(tok, monkeypatch):
    from ipl_jax.eval.online import OnlineEvalConfig, online_eval

    tasks = E.split_world_tasks("test", 3, seed=2, max_steps=4)
    cfg, params = S.make_model(tok)
    config = OnlineEvalConfig(rollout=_config(tok, batch_size=4))
    first = online_eval(params, cfg, tok, tasks, _envs(4), jax.random.PRNGKey(0), config)
    again = online_eval(params, cfg, tok, tasks, _envs(4), jax.random.PRNGKey(0), config)
    assert _timeless(first) == _timeless(again)  # greedy and deterministic
    assert first["episodes"] == 3 and 0.0 <= first["success_rate"] <= 1.0
    assert first["mean_steps"] <= np.mean([t.step_limit for t in tasks])
    assert sum(v["episodes"] for v in first["by_family"].values()) == 3

    monkeypatch.setattr(R, "act", scripted_act(tok, expert_choice))
    tasks = E.split_world_tasks("test", 3, seed=2)
    m = online_eval(None, cfg, tok, tasks, _envs(4), jax.random.PRNGKey(0), config)
    assert m["success_rate"] == 1.0 and m["truncated_rate"] == 0.0
    want = np.mean([E.expert_steps(t.spec.world_seed, t.spec.task, t.spec.config) for t in tasks])
    assert m["mean_steps"] == pytest.approx(want)
    assert all(e["success"] for e in m["episodes_detail"])


@pytest.mark.e2e
def test_random_policy_rollouts_are_deterministic_under_a_key(tok):
    cfg, params = S.make_model(tok)
    tasks = replicate(E.split_world_tasks("train", 2, seed=0, max_steps=3), 2)
    config = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=4)

    def run(key):
        trajs = R.rollout(params, cfg, tok, tasks, _envs(4), jax.random.PRNGKey(key), config)
        return [[(tuple(s.texts), s.reward, s.action) for s in tr.steps] for tr in trajs]

    a, b, c = run(0), run(0), run(1)
    assert a == b and a != c
    # concurrent trajectories of one task differ (their keys come from their names)
    assert a[0] != a[1]
