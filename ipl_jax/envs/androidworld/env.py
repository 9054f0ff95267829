"""``AndroidWorldEnv``: the environment protocol (``envs.protocol``) over one AndroidWorld server.

An episode: ``POST /reset?go_home=true``, ``POST /task/initialize``, ``GET /task/goal``, then a screenshot per
step (``GET /screenshot``) and one ``POST /execute_action`` per action; STOP is sent as a ``status`` action and
ends the episode; ``GET /task/score`` scores it and ``POST /task/tear_down`` closes it. ``EnvTask.spec`` is
``(task_type, task_idx)``, indexes into the suite every server was given by ``suite_tasks`` (the same
``n_task_combinations``, ``seed`` and family on each, so one index is one task instance on every server).

The server does not say a task's complexity (AndroidWorld's own budget is ``int(10 * complexity)``), so the step
budget is ``step_limit`` (default 30: complexity up to 3, most of the suite), or ``step_limits[task_type]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import PIL.Image

from ipl_jax.coat.actions import Action
from ipl_jax.envs.androidworld.actions import UNKNOWN, to_json_action
from ipl_jax.envs.androidworld.client import Client
from ipl_jax.envs.androidworld.screens import decode_pixels
from ipl_jax.envs.protocol import EnvError, EnvTask, Observation

DEFAULT_STEP_LIMIT = 30
DEFAULT_TIMEOUT = 60.0  # seconds a request may take (AndroidWorld's task initialisation can take tens of seconds)
DEFAULT_RETRIES = 2
HEALTH_TIMEOUT = 5.0


class AndroidWorldEnv:
    """One AndroidWorld server (one emulator) as an ``Env``. ``stabilize``: screenshots wait for the screen to
    settle (``wait_to_stabilize``), as AndroidWorld's agents do after an action."""

    def __init__(
        self, url: str, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES, stabilize: bool = True
    ):
        self.client = Client(url, timeout, retries)
        self.name = self.client.url
        self.stabilize = bool(stabilize)
        self.task: EnvTask | None = None
        self.goal = ""
        self.steps = 0
        self.ended = self.stopped = False
        self.screen_size: tuple[int, int] | None = None
        self.last_error = ""  # the device's complaint about the last action, if any

    def _task_params(self) -> dict:
        if self.task is None:
            raise EnvError(f"{self.name}: no episode (call reset first)")
        task_type, task_idx = self.task.spec
        return {"task_type": task_type, "task_idx": int(task_idx)}

    def reset(self, task: EnvTask) -> Observation:
        spec = task.spec
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str)):
            raise EnvError(f"{self.name}: task {task.name!r} has no (task_type, task_idx) spec")
        if self.task is not None:
            self.close()
        self.client.post("/reset", go_home=True)
        self.task, self.goal, self.steps, self.ended, self.last_error = task, "", 0, False, ""
        self.stopped = False
        try:
            self.client.post("/task/initialize", **self._task_params())
        except EnvError as e:
            self.task = None
            raise EnvError(f"{self.name}: task {task.name!r} failed to initialise ({e})", down=e.down) from None
        goal = self.client.get("/task/goal", **self._task_params()).get("goal")
        if not isinstance(goal, str):
            raise EnvError(f"{self.name}/task/goal: no goal text for {task.name!r}")
        self.goal = goal
        return self.observe()

    def observe(self) -> Observation:
        if self.task is None:
            raise EnvError(f"{self.name}: no episode (call reset first)")
        body = self.client.get("/screenshot", raw=True, wait_to_stabilize=self.stabilize)
        try:
            pixels = decode_pixels(body)
        except ValueError as e:
            raise EnvError(f"{self.name}/screenshot: {e}") from None
        image = PIL.Image.fromarray(np.asarray(pixels), mode="RGB")
        self.screen_size = image.size
        return Observation(goal=self.goal, image=image, screen_size=image.size, step=self.steps)

    def act(self, action: Action) -> bool:
        """Play ``action``; True if it ended the episode (STOP). Once the task's step budget is spent nothing more is
        played (the caller ends the episode there as truncated, as in every world)."""
        if self.task is None:
            raise EnvError(f"{self.name}: no episode (call reset first)")
        if self.ended:
            return self.stopped
        if self.screen_size is None:
            self.observe()
        body = to_json_action(action, self.screen_size)
        if body["action_type"] != UNKNOWN:  # the device ignores it: spare the round trip
            answer = self.client.post("/execute_action", body, idempotent=False)
            self.last_error = answer.get("message", "") if answer.get("status") == "error" else ""
        self.steps += 1
        self.stopped = action.type == "stop"
        self.ended = self.stopped or self.steps >= self.task.step_limit
        return self.stopped

    def score(self) -> float:
        value = self.client.get("/task/score", **self._task_params()).get("score")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise EnvError(f"{self.name}/task/score: not a number ({value!r})") from None

    def close(self) -> None:
        """Tear the task down (the device is restored for the next one)."""
        if self.task is None:
            return
        params = self._task_params()
        self.task = None
        self.client.post("/task/tear_down", **params)


def check(url: str, timeout: float = HEALTH_TIMEOUT) -> None:
    """``GET /health`` answers; else ``EnvError``, one line naming the URL (before any model loads)."""
    client = Client(url, timeout, retries=0)
    try:
        answer = client.get("/health")
    except EnvError as e:
        raise EnvError(f"AndroidWorld server {url} is not reachable or not healthy: {e}") from None
    finally:
        client.close()
    if not (isinstance(answer, dict) and answer.get("status") == "success"):
        raise EnvError(f"AndroidWorld server {url} is not healthy: /health answered {answer!r}"[:300])


def open(
    urls: Sequence[str], timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES
) -> list[AndroidWorldEnv]:
    """One ``AndroidWorldEnv`` per server URL, each checked healthy first (one line on the first that is not)."""
    if not urls:
        raise EnvError("AndroidWorld: no server URL given")
    if len(set(urls)) != len(urls):
        raise EnvError(f"AndroidWorld: a server URL is given twice ({', '.join(urls)})")
    for url in urls:
        check(url, min(HEALTH_TIMEOUT, timeout))
    return [AndroidWorldEnv(url, timeout, retries) for url in urls]


def suite_tasks(
    urls: Sequence[str],
    names: Sequence[str] | None = None,
    family: str = "android_world",
    n_task_combinations: int = 1,
    seed: int = 30,
    step_limit: int = DEFAULT_STEP_LIMIT,
    step_limits: Mapping[str, int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
) -> list[EnvTask]:
    """The suite's episodes: every server's suite is rebuilt alike (``/suite/reinitialize``), then the task types
    (``/suite/task_list``), filtered to ``names`` (a name the suite lacks: one line listing it), times their
    instances (``/suite/task_length``). Defaults as AndroidWorld's ``run.py`` (one instance a type, seed 30)."""
    if not urls:
        raise EnvError("AndroidWorld: no server URL given")
    if step_limit < 1 or any(v < 1 for v in (step_limits or {}).values()):
        raise EnvError("AndroidWorld: step limits must be >= 1")
    clients = [Client(url, timeout, retries) for url in urls]
    try:
        for c in clients:
            c.get(
                "/suite/reinitialize", n_task_combinations=int(n_task_combinations), seed=int(seed), task_family=family
            )
        listed = clients[0].get("/suite/task_list", max_index=-1).get("task_list")
        if not isinstance(listed, list):
            raise EnvError(f"{clients[0].url}/suite/task_list: no task list")
        wanted = list(listed) if names is None else [n.strip() for n in names if n.strip()]
        missing = [n for n in wanted if n not in listed]
        if missing:
            raise EnvError(
                f"--tasks: {', '.join(missing)} not in the {family} suite of {urls[0]} ({len(listed)} tasks)"
            )
        out = []
        for task_type in wanted:
            n = int(clients[0].get("/suite/task_length", task_type=task_type).get("length", 0))
            limit = int((step_limits or {}).get(task_type, step_limit))
            out += [EnvTask(f"{task_type}/{i}", limit, task_type, (task_type, i)) for i in range(n)]
        return out
    finally:
        for c in clients:
            c.close()
