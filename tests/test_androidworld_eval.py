"""Playing AndroidWorld over HTTP: the stand-in server (tests/support/aw_server.py) serves the synthetic world through
AndroidWorld's API. A scripted policy scores the same in process and through the server; a dead server's slot is
dropped and its tasks go to the live ones; ``ipl-jax eval --env androidworld`` scores every task, survives a server
killed mid-run and resumes without replaying finished episodes; one PPO round plays its rollouts on the servers.
(A wrong --env-url ending in one line before any model loads: tests/test_cli_errors.py, "eval --env-url
unreachable".)"""

from __future__ import annotations

import json
import zlib

import jax
import numpy as np
import pytest

pytest.importorskip("transformers")

from support import rl_setup as S

from ipl_jax.coat.actions import Action, format_action, format_grounding, needs_grounding, parse_action
from ipl_jax.envs.androidworld import client as aw_client
from ipl_jax.envs.androidworld.env import AndroidWorldEnv, suite_tasks
from ipl_jax.envs.protocol import EnvError, EnvTask, Observation
from ipl_jax.envs.synthetic.env import SyntheticEnv, WorldSpec
from ipl_jax.envs.synthetic.expert import expert_decision
from ipl_jax.envs.synthetic.world import World
from ipl_jax.rl import rollout as R
from ipl_jax.rl.rollout import wilson_interval
from ipl_jax.rl.sampling import Completion
from tests.support.aw_server import SyntheticAndroidWorld, synthetic_task

SEED = 7  # the servers' suite seed


@pytest.fixture
def servers(monkeypatch):
    monkeypatch.setattr(aw_client, "RETRY_PAUSE", 0.0)
    started = [SyntheticAndroidWorld().start() for _ in range(2)]
    yield started
    for s in started:
        s.kill()


def shadow_expert(tokenizer, specs: dict):
    """A stand-in for ``rl.rollout.act``: the scripted expert deciding on a shadow ``World`` of each episode
    (``specs``: name -> (world seed, task, config)), except on screens whose pixels hash to 0 mod 4, where it
    presses back; the shadow plays the parsed action too. It reads the screen, so both worlds must show the same."""
    shadows = {}

    def act(params, cfg, items, steps, seed, config, mesh=None):
        out = []
        for step in steps:
            if step.step_id == 0:
                world_seed, task, wcfg = specs[step.episode_id]
                shadows[step.episode_id] = (World(world_seed, wcfg), task)
                shadows[step.episode_id][0].reset(task)
            world, task = shadows[step.episode_id]
            pixels = np.asarray(step.image().convert("RGB"))
            assert np.array_equal(pixels, np.asarray(world.screen.image.convert("RGB")))
            a = expert_decision(world, task).action
            if zlib.crc32(pixels.tobytes() + bytes([step.step_id])) % 4 == 0:
                a = Action(type="press", button="back")
            s3, s4 = format_action(a), format_grounding(a.box) if needs_grounding(a) else ""
            world.step(parse_action(s3, s4))
            turns = tuple(np.asarray(tokenizer.encode(t + "<|im_end|>"), np.int32) for t in ("a", "b", s3, s4))
            out.append(
                Completion(turns=turns, logps=tuple(np.zeros(len(t), np.float32) for t in turns), finished=(True,) * 4)
            )
        return out

    return act


def _outcome(tr):
    return (tr.task.name, [s.texts[2] for s in tr.steps], tr.success, tr.score, tr.stopped, tr.truncated, tr.error)


def test_the_same_policy_scores_the_same_in_process_and_through_the_server(servers, tmp_path, monkeypatch):
    tok = S.make_tokenizer(tmp_path / "tok")
    config = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=2)
    urls = [s.url for s in servers]
    remote = suite_tasks(urls, names=["toggle", "open_app", "install", "send_message"], seed=SEED, step_limit=8)
    specs = {t.name: synthetic_task(SEED, *t.spec) for t in remote}
    local = [EnvTask(t.name, t.step_limit, t.family, WorldSpec(*specs[t.name])) for t in remote]
    runs = []
    for tasks, envs in ((local, [SyntheticEnv(), SyntheticEnv()]), (remote, [AndroidWorldEnv(u, 10, 0) for u in urls])):
        monkeypatch.setattr(R, "act", shadow_expert(tok, specs))
        runs.append(R.rollout(None, S.make_config(tok), tok, tasks, envs, jax.random.PRNGKey(0), config))
    assert [_outcome(tr) for tr in runs[0]] == [_outcome(tr) for tr in runs[1]]
    assert any(tr.success for tr in runs[0]) and any(len(tr.steps) > 1 for tr in runs[0])
    assert any("press back" in s.texts[2] for tr in runs[0] for s in tr.steps)  # the policy's own turns happened
    inits = [s.requests.count("POST /task/initialize") for s in servers]  # each server starts one, then takes more
    assert sum(inits) == 4 and min(inits) >= 1


class DownEnv:
    """A slot whose server goes away: ``down_at`` "reset" or a step number raises a ``down`` EnvError."""

    concurrent = True

    def __init__(self, name, down_at=None):
        self.name, self.down_at, self.steps, self.played = name, down_at, 0, []

    def reset(self, task):
        if self.down_at == "reset":
            raise EnvError(f"{self.name}/reset: connection refused (after 1 of 1 tries)", down=True)
        self.steps, self.task = 0, task
        return self.observe()

    def observe(self):
        from PIL import Image

        return Observation(goal="g", image=Image.new("RGB", (112, 56)), screen_size=(1080, 540), step=self.steps)

    def act(self, action):
        if self.down_at == self.steps:
            raise EnvError(f"{self.name}/execute_action: connection refused (after 1 of 1 tries)", down=True)
        self.steps += 1
        if action.type == "stop":
            self.played.append(self.task.name)
        return action.type == "stop"

    def score(self):
        return 1.0

    def close(self):
        pass


def back_then_stop(tok, calls=None):
    """A stand-in for ``rl.rollout.act``: press back at step 0, stop at step 1; ``calls`` gets each call's rows."""

    def act(params, cfg, items, steps, seed, config, mesh=None):
        if calls is not None:
            calls.append([(s.episode_id, s.step_id) for s in steps])
        texts = [("a", "b", "stop" if s.step_id == 1 else "press back", "") for s in steps]
        return [
            Completion(
                turns=tuple(np.asarray(tok.encode(t + "<|im_end|>"), np.int32) for t in tt),
                logps=(np.zeros(1, np.float32),) * 4,
                finished=(True,) * 4,
            )
            for tt in texts
        ]

    return act


def test_a_dead_slot_is_dropped_and_its_tasks_go_to_the_live_ones(tmp_path, monkeypatch):
    tok = S.make_tokenizer(tmp_path / "tok")
    config = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=4)
    monkeypatch.setattr(R, "act", back_then_stop(tok))
    tasks = [EnvTask(name=f"t{i}", step_limit=4) for i in range(5)]
    envs = [DownEnv("a", down_at=1), DownEnv("b"), DownEnv("c", down_at="reset")]
    done = []
    trajs = R.rollout(None, S.make_config(tok), tok, tasks, envs, jax.random.PRNGKey(0), config, on_done=done.append)
    # t0 on a died at its second action; t2, never started on c, and t3, t4 were played by b
    assert [tr.task.name for tr in trajs] == [f"t{i}" for i in range(5)]
    assert trajs[0].error == "a/execute_action: connection refused (after 1 of 1 tries)" and trajs[0].num_steps == 2
    assert all(tr.error is None and tr.success for tr in trajs[1:])
    assert envs[1].played == ["t1", "t2", "t3", "t4"] and envs[0].played == [] and envs[2].played == []
    assert sorted(tr.task.name for tr in done) == [f"t{i}" for i in range(5)]  # each reported once, when final
    all_down = [DownEnv("a", down_at="reset"), DownEnv("b", down_at=0)]
    trajs = R.rollout(None, S.make_config(tok), tok, tasks[:3], all_down, jax.random.PRNGKey(0), config)
    # t0 could not start on a, t1 died on b: nothing is live for t0 (handed back) and t2; the reason is the last
    assert trajs[1].error.startswith("b/execute_action") and trajs[1].num_steps == 1
    gone = f"{R.NO_LIVE_SERVER} (b/execute_action: connection refused (after 1 of 1 tries))"
    assert [trajs[0].error, trajs[2].error] == [gone, gone] and trajs[0].num_steps == 0


def test_a_slow_server_holds_up_only_its_own_episodes(servers, tmp_path, monkeypatch):
    """Two servers, the second answering each screenshot after 1 s: the first plays its task and then the two
    left while the second's first episode is still running (lockstep would end t0, t1 and then t2, t3), and every
    episode is played to its end and scored, each step sampled once."""
    tok = S.make_tokenizer(tmp_path / "tok")
    config = R.RolloutConfig(
        sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=2, gather_seconds=0.1
    )
    calls = []
    monkeypatch.setattr(R, "act", back_then_stop(tok, calls))
    fast, slow = servers
    slow.hang["/screenshot"] = 1.0
    tasks = suite_tasks(
        [s.url for s in servers], names=["toggle", "open_app", "install", "send_message"], seed=SEED, step_limit=4
    )
    names = [t.name for t in tasks]
    envs = [AndroidWorldEnv(s.url, 10, 0) for s in servers]
    done = []
    trajs = R.rollout(None, S.make_config(tok), tok, tasks, envs, jax.random.PRNGKey(0), config, on_done=done.append)
    assert [tr.task.name for tr in done] == [names[0], names[2], names[3], names[1]]
    assert [_inits(fast), _inits(slow)] == [3, 1] and [s.requests.count("GET /task/score") for s in servers] == [3, 1]
    assert all(tr.error is None and tr.stopped and tr.num_steps == 2 for tr in trajs)
    assert [tr.task.name for tr in trajs] == names
    assert sorted(row for call in calls for row in call) == sorted((n, t) for n in names for t in (0, 1))


# ---------------------------------------------------------------------------------------------- ipl-jax eval


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from ipl_jax.data.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("aw_eval") / "ckpt", seed=0, scale=4.0)


def _eval(tiny_ckpt, urls, out, tasks="toggle,open_app,install", flag="--model"):
    from ipl_jax.cli import main

    args = ["eval", "--env", "androidworld", "--tasks", tasks, flag, str(tiny_ckpt), "--max-steps", "2"]
    for u in urls:
        args += ["--env-url", u]
    return main([*args, "--json", str(out / "results.json"), "--predictions", str(out / "episodes.jsonl")])


def _inits(server):
    return server.requests.count("POST /task/initialize")


def test_eval_scores_every_task_and_resumes_without_replaying(servers, tiny_ckpt, tmp_path, capsys):
    server = servers[0]
    assert _eval(tiny_ckpt, [server.url], tmp_path) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    names = ["toggle/0", "open_app/0", "install/0"]
    assert [t["name"] for t in res["tasks"]] == names and res["episodes"] == 3 and _inits(server) == 3
    for t in res["tasks"]:
        assert t["steps"] == 2 == t["step_limit"] and t["error"] is None and t["wall_seconds"] > 0
        assert t["score"] in (0.0, 1.0) and t["success"] == (t["score"] == 1.0)
    wins = sum(t["success"] for t in res["tasks"])
    assert res["success_rate"] == wins / 3 and res["success_ci95"] == [round(x, 4) for x in wilson_interval(wins, 3)]
    assert res["env"] == "androidworld" and res["servers"] == [server.url] and res["resumed"] == 0
    log = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in log] == names
    # interrupted after the first episode, its second half-written: a rerun plays only the other two
    (tmp_path / "episodes.jsonl").write_text(log[0] + "\n" + log[1][:20])
    capsys.readouterr()
    assert _eval(tiny_ckpt, [server.url], tmp_path, flag="--checkpoint") == 0  # the flag's other name
    assert _inits(server) == 3 + 2 and "resuming: 1 of 3 episodes" in capsys.readouterr().out
    again = json.loads((tmp_path / "results.json").read_text())
    assert [t["name"] for t in again["tasks"]] == names and again["resumed"] == 1
    assert again["tasks"][0] == res["tasks"][0]
    assert [json.loads(line)["name"] for line in (tmp_path / "episodes.jsonl").read_text().splitlines()] == names


def test_eval_with_a_server_killed_mid_run(servers, tiny_ckpt, tmp_path, capfd):
    a, b = servers
    a.die_on["/task/score"] = 1  # a dies as its first episode is scored
    assert _eval(tiny_ckpt, [a.url, b.url], tmp_path) == 0
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    res = json.loads((tmp_path / "results.json").read_text())
    by = {t["name"]: t for t in res["tasks"]}
    assert by["toggle/0"]["error"].startswith(f"{a.url}/task/score: ") and not by["toggle/0"]["success"]
    assert by["open_app/0"]["error"] is None and by["install/0"]["error"] is None  # b played them
    assert (_inits(a), _inits(b)) == (1, 2) and res["failed_episodes"] == 1
    assert res["errors"] == {"toggle/0": by["toggle/0"]["error"]}


@pytest.mark.e2e
def test_one_ppo_round_plays_its_rollouts_on_the_servers(servers, tmp_path, monkeypatch):
    from ipl_jax.rl import ppo
    from ipl_jax.rl.rows import RowConfig
    from ipl_jax.rl.sections import PPOSettings

    tok = S.make_tokenizer(tmp_path / "tok")
    cfg, params = S.make_model(tok)
    urls = [s.url for s in servers]
    tasks = suite_tasks(urls, names=["toggle", "open_app"], seed=SEED, step_limit=6)
    monkeypatch.setattr(
        R, "act", shadow_expert(tok, {f"{t.name}#{j}": synthetic_task(SEED, *t.spec) for t in tasks for j in range(2)})
    )
    rc = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=2)
    section = PPOSettings(tasks_per_batch=1, trajectories_per_task=2, minibatch_rows=8, critic_warmup=0)
    config = ppo.PPOConfig(
        model=cfg, settings=section, rows=RowConfig(text_buckets=(320,), patch_buckets=(256,)), logp_chunk=32
    )
    state = ppo.init_ppo_state(params, config, jax.random.PRNGKey(0))
    envs = [AndroidWorldEnv(u, 10, 0) for u in urls]
    state, m = ppo.ppo_round(
        state, None, tasks, jax.random.PRNGKey(1), config, envs=envs, tokenizer=tok, rollout_config=rc, env_steps=8
    )
    assert m["env_steps"] == 8 and m["updates"] >= 1 and m["train_episodes"]["failed_episodes"] == 0
    assert all(np.isfinite(m[k]) for k in ("policy_loss", "value_loss"))
    assert sum(s.requests.count("POST /execute_action") for s in servers) == 8  # every step played over HTTP
