"""The environment protocol (``envs.protocol``) and what plays through it: the synthetic world as an ``Env`` replays
the generated episodes exactly, a rollout over several environments loses only the episode whose environment
fails, the summary's interval is Wilson's, and the ``env`` settings open and check their slots."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("transformers")

from support import rl_setup as S

from ipl_jax.coat.actions import Action
from ipl_jax.envs import check_envs, open_envs
from ipl_jax.envs.protocol import EnvError, EnvTask, Observation, replicate
from ipl_jax.envs.sections import EnvSettings
from ipl_jax.envs.synthetic.dataset import generate_split
from ipl_jax.envs.synthetic.env import SyntheticEnv, split_world_tasks
from ipl_jax.rl import rollout as R
from ipl_jax.rl.sampling import Completion
from ipl_jax.sections import SettingsError


def test_synthetic_env_replays_the_generated_episodes():
    """The expert's actions through the protocol: each observation's expert, goal, screen size and app / page are the
    stored episode's step, the episode stops after its last step, and it scores 1 (a wrong stop scores 0)."""
    episodes = generate_split("test", 4, seed=5)
    tasks = split_world_tasks("test", 4, seed=5)
    env = SyntheticEnv()
    for ep, task in zip(episodes, tasks):
        obs = env.reset(task)
        for k, step in enumerate(ep.steps):
            assert obs.step == k and obs.goal == ep.instruction == step.instruction
            assert obs.expert == step.action and tuple(obs.screen_size) == tuple(step.screen_size)
            assert obs.image.size == step.load_image().size
            assert np.array_equal(np.asarray(obs.image), np.asarray(step.load_image()))
            done = env.act(obs.expert)
            assert done == (k == len(ep.steps) - 1)
            if not done:
                obs = env.observe()
        assert env.score() == 1.0
        env.close()
    env.reset(tasks[0])
    assert env.act(Action(type="stop")) and env.score() == 0.0  # stopped before the goal
    with pytest.raises(EnvError, match="not a WorldSpec"):
        env.reset(EnvTask(name="x", step_limit=3, spec=None))


class FakeEnv:
    """A scripted world without an expert: STOP ends it with ``score``; ``fail_at`` ("reset" or a step number)
    raises ``EnvError`` there."""

    concurrent = True

    def __init__(self, name, score=1.0, fail_at=None):
        self.name, self._score, self.fail_at = name, score, fail_at
        self.steps, self.closed, self.acted = 0, 0, []

    def reset(self, task):
        if self.fail_at == "reset":
            raise EnvError(f"{self.name}: task {task.name} failed to initialise")
        self.steps = 0
        return self.observe()

    def observe(self):
        img = Image.new("RGB", (112, 56), (30 * self.steps, 90, 120))
        return Observation(goal="do the thing", image=img, screen_size=(1080, 540), step=self.steps, meta={"app": "A"})

    def act(self, action):
        if self.fail_at == self.steps:
            raise EnvError(f"{self.name}: /execute_action timed out after 2 retries")
        self.acted.append(action.type)
        self.steps += 1
        return action.type == "stop"

    def score(self):
        return self._score

    def close(self):
        self.closed += 1


def _scripted(tokenizer, texts_of):
    """An ``act`` stand-in: turn 3 is ``texts_of(step)`` (its step_id says when to stop)."""

    def act(params, cfg, items, steps, seed, config, mesh=None):
        out = []
        for step in steps:
            texts = ["a screen", "a thought", texts_of(step), ""]
            turns = tuple(np.asarray(tokenizer.encode(t + "<|im_end|>"), np.int32) for t in texts)
            out.append(
                Completion(turns=turns, logps=tuple(np.zeros(len(t), np.float32) for t in turns), finished=(True,) * 4)
            )
        return out

    return act


def test_a_failing_environment_fails_only_its_own_episode(tmp_path, monkeypatch):
    tok = S.make_tokenizer(tmp_path / "tok")
    config = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=4)
    monkeypatch.setattr(R, "act", _scripted(tok, lambda step: "stop" if step.step_id == 2 else "press back"))
    envs = [FakeEnv("http://a:5000"), FakeEnv("http://b:5000", fail_at=1), FakeEnv("http://c:5000", score=0.5)]
    envs.append(FakeEnv("http://d:5000", fail_at="reset"))
    tasks = [EnvTask(name=f"t{i}", step_limit=5, family="f") for i in range(4)]
    trajs = R.rollout(None, S.make_config(tok), tok, tasks, envs, jax.random.PRNGKey(0), config)
    a, b, c, d = trajs
    assert a.error is None and a.stopped and a.success and a.num_steps == 3 and a.score == 1.0
    assert a.terminal_reward == config.settings.success_reward and a.goal == "do the thing"
    assert envs[0].acted == ["press", "press", "stop"] and [s.app for s in a.steps] == ["A"] * 3
    assert b.error == "http://b:5000: /execute_action timed out after 2 retries" and not b.success
    assert b.num_steps == 2 and envs[1].acted == ["press"]  # its second action failed; the others went on
    assert c.success is False and c.score == 0.5 and c.terminal_reward == 0.5 * config.settings.success_reward
    assert d.error == "http://d:5000: task t3 failed to initialise" and d.num_steps == 0
    assert all(e.closed == 1 for e in envs)  # every episode closed once, failed or not
    assert all(s.reward == 0.0 and s.golden is None for tr in trajs for s in tr.steps)  # no expert: no step reward
    assert all(tr.wall_seconds > 0 for tr in trajs)
    summary = R.rollout_summary(trajs)
    assert summary["failed_episodes"] == 2 and summary["success_rate"] == 0.25 and summary["mean_score"] == 0.375
    assert summary["errors"] == {"t1": b.error, "t3": d.error}
    assert summary["success_ci95"] == [round(x, 4) for x in R.wilson_interval(1, 4)]


class LocalFakeEnv(FakeEnv):
    concurrent = False  # in process: lockstep batches


@pytest.mark.parametrize(
    "env_class, want",
    [  # t1 takes two steps, the others one
        (LocalFakeEnv, [["t0", "t1"], ["t1"], ["t2", "t3"], ["t4"]]),  # batches of two; the next after both end
        (FakeEnv, [["t0", "t1"], ["t1", "t2"], ["t3", "t4"]]),  # a slot takes the next task as its episode ends
    ],
)
def test_rollout_spreads_the_tasks_over_the_slots(env_class, want, tmp_path, monkeypatch):
    """Five tasks on two slots: in process, batches of two with the k-th task of a batch on slot k; networked, each
    slot starts the next task as soon as its episode ends. Every task is played once, names and keys kept."""
    tok = S.make_tokenizer(tmp_path / "tok")
    config = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=4)
    calls = []
    scripted = _scripted(tok, lambda step: "stop" if step.step_id == 1 or step.episode_id != "t1#0" else "press back")

    def act(params, cfg, items, steps, *args, **kw):
        calls.append([s.episode_id.split("#")[0] for s in steps])
        return scripted(params, cfg, items, steps, *args, **kw)

    monkeypatch.setattr(R, "act", act)
    envs = [env_class("a"), env_class("b")]
    tasks = replicate([EnvTask(name=f"t{i}", step_limit=3) for i in range(5)], 1)
    trajs = R.rollout(None, S.make_config(tok), tok, tasks, envs, jax.random.PRNGKey(0), config)
    assert [tr.task.name for tr in trajs] == [f"t{i}#0" for i in range(5)] and all(tr.success for tr in trajs)
    assert [tr.num_steps for tr in trajs] == [1, 2, 1, 1, 1] and calls == want
    if env_class is LocalFakeEnv:
        assert envs[0].closed == 3 and envs[1].closed == 2
    else:
        assert envs[0].closed + envs[1].closed == 5 and min(envs[0].closed, envs[1].closed) >= 1


def test_wilson_interval_by_hand():
    lo, hi = R.wilson_interval(8, 10)  # p = 0.8, z = 1.96: centre 0.71674, half-width 0.22658
    assert lo == pytest.approx(0.49016, abs=1e-4) and hi == pytest.approx(0.94332, abs=1e-4)
    assert R.wilson_interval(0, 5)[0] == 0.0 and R.wilson_interval(5, 5)[1] == 1.0
    assert R.wilson_interval(0, 0) is None


def test_env_settings_open_and_check_their_slots():
    envs = open_envs(EnvSettings(), 3)
    assert len(envs) == 3 and all(isinstance(e, SyntheticEnv) and not e.concurrent for e in envs)
    with pytest.raises(SettingsError, match=r"^config\.env\.urls=\(\): must name one or more servers"):
        EnvSettings(kind="androidworld")
    with pytest.raises(SettingsError, match=r"^config\.env\.kind='gym': must be one of synthetic, androidworld"):
        EnvSettings(kind="gym")
    aw = EnvSettings(kind="androidworld", urls=("http://h1:5000", "http://h2:5000"))
    asked = []

    def check(url):
        asked.append(url)
        if url.endswith("h2:5000"):
            raise EnvError(f"{url}: not reachable (connection refused)")

    with pytest.raises(EnvError, match=r"^http://h2:5000: not reachable"):
        check_envs(aw, check)
    assert asked == ["http://h1:5000", "http://h2:5000"]
    check_envs(EnvSettings(), check)  # the synthetic world: nothing to check
    assert asked == ["http://h1:5000", "http://h2:5000"]


def test_the_job_reads_its_env_section():
    from ipl_jax.pipeline.paths import UsageError
    from ipl_jax.pipeline.sources import check_env
    from ipl_jax.settings import Settings

    job = Settings().replace({"env.kind": "androidworld", "env.urls": ("http://h:5000",), "data.format": "tfds:x"})
    assert job.env.urls == ("http://h:5000",)  # AndroidWorld plays without the synthetic dataset

    def down(url):
        raise EnvError(f"{url}: GET /health failed")

    with pytest.raises(UsageError, match=r"^config\.env: http://h:5000: GET /health failed$"):
        check_env(job, "config.env", down)
