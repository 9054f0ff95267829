"""The environment protocol: what the live-world evaluation, the online PPO / GiGPPO rollouts and ``ipl-jax eval
--online`` play, whichever world is behind it (the synthetic world in process, AndroidWorld over HTTP).

One ``Env`` plays one episode at a time: ``reset(task)`` starts it, ``observe()`` gives the screen and goal,
``act(action)`` applies one parsed CoaT action (screen fractions, as everywhere in ``coat.actions``) and says
whether the episode ended (STOP), ``score()`` is the task's own success in [0, 1] once it ended or ran out of
steps, ``close()`` frees the episode (AndroidWorld: tear the task down). Nothing above this module knows which
world it plays.

Failures are ordinary: an implementation raises ``EnvError`` (one line naming the URL or task and what went wrong)
once its own bounded retries are spent; the caller records that episode as failed with the reason and goes on with
the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ipl_jax.coat.actions import Action


class EnvError(RuntimeError):
    """An environment could not do what was asked (server down or unhealthy, a request that failed after its
    retries, a task that failed to initialise). The message is one line naming where and what. ``down``: the
    environment is gone (its server refuses or cannot be reached after the retries), so the caller stops giving it
    episodes; a slow or failing server is not down (its episode fails, the next one is tried)."""

    def __init__(self, message: str = "", down: bool = False):
        super().__init__(message)
        self.down = bool(down)


@dataclasses.dataclass(frozen=True)
class EnvTask:
    """One episode to play.

    ``name``: unique per episode (the sampler's RNG keys come from ``step_uid(name, t)``; results are keyed by it).
    ``step_limit``: the most actions the episode may take. ``family``: the task family the results group by.
    ``spec``: the implementation's own description of the task (synthetic: world seed, ``Task`` and
    ``WorldConfig``; AndroidWorld: task type and index), opaque to every caller.
    """

    name: str
    step_limit: int
    family: str = ""
    spec: Any = None


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the policy sees at one step.

    ``goal``: the task instruction. ``image``: the screen, a PIL RGB image at the device's resolution (the
    processor resizes it as the checkpoint expects). ``screen_size``: (width, height) in pixels of the screen the
    actions' fractions refer to. ``step``: actions taken so far in this episode. ``expert``: the scripted expert's
    next action where the world has one (synthetic; dense step rewards need it), else None. ``elements``: the
    screen's UI elements where known (``data.records.UIElement``). ``meta``: world facts where known (``app``,
    ``page``), for reports only; a policy never reads them.
    """

    goal: str
    image: Any
    screen_size: tuple[int, int]
    step: int
    expert: Action | None = None
    elements: tuple = ()
    meta: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Env(Protocol):
    """One environment slot (one synthetic world; one AndroidWorld server = one emulator)."""

    name: str  # where it plays, for messages and results ("synthetic", "http://host:5000")
    concurrent: bool  # its calls wait on a server: each slot plays on its own thread (``rl.episodes``); absent: True

    def reset(self, task: EnvTask) -> Observation: ...

    def observe(self) -> Observation: ...

    def act(self, action: Action) -> bool: ...

    def score(self) -> float: ...

    def close(self) -> None: ...


def replicate(tasks: Sequence[EnvTask], k: int) -> list[EnvTask]:
    """Each task ``k`` times, named ``name#j`` (concurrent episodes of one task: distinct names, hence keys)."""
    return [dataclasses.replace(t, name=f"{t.name}#{j}") for t in tasks for j in range(int(k))]


def is_concurrent(envs: Sequence[Env]) -> bool:
    """Whether ``envs`` are played in threads: any slot whose ``concurrent`` is True or unset (behind a network)."""
    return any(getattr(e, "concurrent", True) for e in envs)
