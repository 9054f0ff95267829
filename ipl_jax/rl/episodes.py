"""Episodes on environment slots (``envs.protocol``): the records a rollout keeps (``StepRecord``, ``Trajectory``)
and the slots that play them (``Slots``). The policy's side, one sampler call for the episodes whose observation
is ready, is ``rl.rollout``'s.

In-process worlds play in lockstep batches (every env call at once, in this thread: results do not depend on
timing). Networked slots play on their own: each slot's env calls run in its own thread, and a slot whose episode
ended starts the next task not yet started, so a slow server holds up only its own episodes.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ipl_jax.coat.actions import Action, format_action
from ipl_jax.envs.protocol import Env, EnvError, EnvTask, Observation, is_concurrent
from ipl_jax.rl.sampling import Completion
from ipl_jax.sampling.prompts import StepPrompts


@dataclasses.dataclass
class StepRecord:
    """One environment step: prompt (if kept), completion, turn texts, parsed and expert (None: the world has none)
    actions, reward, thumbnail, and the screen's app / page where the world says."""

    t: int
    prompt: StepPrompts | None
    completion: Completion
    texts: list
    action: Action
    golden: Action | None
    reward: float
    thumb: np.ndarray
    app: str
    page: str


@dataclasses.dataclass
class Trajectory:
    """One episode: task, goal, steps, and outcome: ``stopped``, ``score`` (the world's, in [0, 1]), ``success``
    (score 1: for the synthetic world, stopped at the goal), ``truncated`` (step limit), ``cut`` (budget ran out,
    outcome unknown), ``error`` (an ``EnvError`` ended it: failed, outcome unknown), ``wall_seconds`` (seconds from its
    reset to its end)."""

    task: EnvTask
    goal: str = ""
    steps: list = dataclasses.field(default_factory=list)
    stopped: bool = False
    success: bool = False
    truncated: bool = False
    terminal_reward: float = 0.0
    cut: bool = False
    score: float = 0.0
    error: str | None = None
    wall_seconds: float = 0.0

    @property
    def unknown(self) -> bool:
        """Its return is unknown (cut by the budget, or ended by an environment's failure): nothing to learn from."""
        return self.cut or self.error is not None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def step_rewards(self) -> np.ndarray:
        return np.asarray([s.reward for s in self.steps], np.float32)


NO_LIVE_SERVER = "no live server"  # the error of the episodes left when every environment is down


def _reason(err: EnvError) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


class _Queue:
    """Task indexes not yet started, ascending (a task handed back goes in its place, before the later ones); shared
    by the slots' threads."""

    def __init__(self, n: int):
        self.left, self.lock = list(range(n)), threading.Lock()

    def take(self) -> int | None:
        with self.lock:
            return self.left.pop(0) if self.left else None

    def give_back(self, j: int) -> None:
        with self.lock:
            bisect.insort(self.left, j)


@dataclasses.dataclass
class _Episode:
    j: int  # its task's index
    traj: Trajectory
    t0: float
    history: list = dataclasses.field(default_factory=list)
    obs: Observation | None = None


class _Slot:
    """One environment and the episode it plays. A job (``run``) makes its env calls; while one is in flight (in the
    slot's thread) nothing else touches the slot. Ended episodes wait in ``ended`` for the caller's thread; ``down``:
    the reason its server is gone. ``chain``: after its episode ends, the job starts the queue's next task."""

    def __init__(self, env: Env, tasks: Sequence[EnvTask], queue: _Queue, success_reward: float, chain: bool):
        self.env, self.tasks, self.queue, self.success_reward, self.chain = env, tasks, queue, success_reward, chain
        self.ep: _Episode | None = None
        self.ended: list[_Episode] = []
        self.down: str | None = None
        self.future: Future | None = None
        self.since, self.last = 0.0, None  # when its job started; how long its previous one took

    def run(self, fn, *args) -> None:
        fn(*args)
        if self.chain and self.ep is None and self.down is None:
            j = self.queue.take()
            if j is not None:
                self.start(j)
        self.last = time.perf_counter() - self.since

    def start(self, j: int) -> None:
        self.ep = _Episode(j, Trajectory(task=self.tasks[j]), time.perf_counter())
        try:
            self.ep.obs = self.env.reset(self.ep.traj.task)
        except EnvError as e:
            if e.down:  # nothing to tear down and nothing played: the task goes back
                self.down, self.ep = _reason(e), None
                self.queue.give_back(j)
            else:
                self._fail(e)
            return
        self.ep.traj.goal = self.ep.obs.goal

    def step(self, action: Action, last: bool) -> None:
        """Apply the chosen action (an unparsable one touches nothing); ``last``: the step limit is reached."""
        ep = self.ep
        if action.parsed:
            try:
                stopped = self.env.act(action)
            except EnvError as e:
                return self._fail(e)
            ep.history.append(format_action(action))
            ep.obs = None
            if stopped:
                ep.traj.stopped = True
                return self._finish()
        if last:
            ep.traj.truncated = True
            return self._finish()
        if ep.obs is None:
            try:
                ep.obs = self.env.observe()
            except EnvError as e:
                self._fail(e)

    def cut(self) -> None:
        self.ep.traj.cut = True
        self._close()

    def _finish(self) -> None:
        """Score the ended episode (terminal reward ``success_reward · score``; success: score 1), then close."""
        try:
            score = float(self.env.score())
        except EnvError as e:
            return self._fail(e)
        tr = self.ep.traj
        tr.score, tr.success, tr.terminal_reward = score, score >= 1.0, self.success_reward * score
        self._close()

    def _fail(self, err: EnvError) -> None:
        self.ep.traj.error = _reason(err)
        if err.down:  # nothing to tear down on a server that is gone
            self.down = self.ep.traj.error
            return self._end()
        self._close()

    def _close(self) -> None:
        try:
            self.env.close()
        except EnvError:  # a failing close loses nothing recorded
            pass
        self._end()

    def _end(self) -> None:
        self.ep.traj.wall_seconds = time.perf_counter() - self.ep.t0
        self.ended.append(self.ep)
        self.ep = None


class Slots:
    """The slots of one ``rollout`` call and its results: deals tasks, runs the slots' jobs (in their threads for
    networked envs, at once otherwise), collects what they ended. Everything here runs in the caller's thread."""

    def __init__(self, tasks, envs, batch_size: int, gather_seconds: float, success_reward: float, on_done):
        self.lockstep = not is_concurrent(envs)
        self.queue, self.on_done = _Queue(len(tasks)), on_done
        self.batch_size, self.gather_seconds = batch_size, gather_seconds
        self.slots = [_Slot(env, tasks, self.queue, success_reward, not self.lockstep) for env in envs]
        self.live = list(self.slots)
        self.pool = None if self.lockstep else ThreadPoolExecutor(max_workers=len(envs))
        self.out: dict[int, Trajectory] = {}
        self.tasks, self.taken, self.last_down = tasks, 0, ""

    def __enter__(self) -> Slots:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            if exc[0] is not None:  # the jobs in flight start no further task
                with self.queue.lock:
                    self.queue.left.clear()
            self.pool.shutdown(wait=True)

    def trajectories(self) -> list[Trajectory]:
        return [self.out[j] for j in range(len(self.tasks))]

    def _submit(self, slot: _Slot, fn, *args) -> None:
        slot.since = time.perf_counter()
        if self.pool is None:
            slot.run(fn, *args)
            self._collect(slot)
        else:
            slot.future = self.pool.submit(slot.run, fn, *args)

    def _collect(self, slot: _Slot) -> None:
        """Take in a finished job: report its ended episodes; drop the slot if its server is gone."""
        if slot.future is not None:
            slot.future.result()  # re-raises what is not an EnvError
            slot.future = None
        for ep in slot.ended:
            self._record(ep.j, ep.traj)
        slot.ended = []
        if slot.down is not None and slot in self.live:
            self.live.remove(slot)
            self.last_down = slot.down

    def _record(self, j: int, traj: Trajectory) -> None:
        self.out[j] = traj
        if self.on_done is not None:
            self.on_done(traj)

    def deal(self) -> bool:
        """Start tasks on the idle live slots (lockstep: a whole batch once every slot is idle); False once every
        task is recorded."""
        busy = [s for s in self.slots if s.ep is not None or s.future is not None]
        if self.lockstep and busy:
            return True
        idle = [s for s in self.live if s not in busy]
        dealt = [(slot, self.queue.take()) for slot in (idle[: self.batch_size] if self.lockstep else idle)]
        for slot, j in dealt:  # taken first: the k-th idle slot gets the k-th task, whatever its reset does
            if j is not None:
                self._submit(slot, slot.start, j)
        if not self.live:  # every slot is down: the tasks left are failed
            reason = f"{NO_LIVE_SERVER} ({self.last_down})" if self.last_down else NO_LIVE_SERVER
            while (j := self.queue.take()) is not None:
                self._record(j, Trajectory(task=self.tasks[j], error=reason))
        return len(self.out) < len(self.tasks)

    def wait(self) -> list[_Slot]:
        """The slots whose observation is ready, earliest task first. Networked: waits for at least one, then up to
        ``gather_seconds`` for the others in flight expected within it: running no longer than that yet, and by the
        length of their previous job (a full sampler call rather than two half ones; a slow slot joins a later
        call)."""
        pending = [s for s in self.slots if s.future is not None]
        if pending and not self._ready():
            while not any(s.future.done() for s in pending):
                futures.wait([s.future for s in pending], timeout=1.0, return_when=futures.FIRST_COMPLETED)
        self._collect_done(pending)
        pending = [s for s in pending if s.future is not None]
        if pending and self.gather_seconds > 0 and len(self._ready()) < self.batch_size:
            now, window = time.perf_counter(), self.gather_seconds
            # not yet running longer than the window, and by its previous job done within it
            soon = [s.future for s in pending if now - s.since <= window and s.since + (s.last or 0) <= now + window]
            futures.wait(soon, timeout=window)
            self._collect_done(pending)
        return sorted(self._ready(), key=lambda s: s.ep.j)

    def _ready(self) -> list[_Slot]:
        return [s for s in self.slots if s.ep is not None and s.future is None]

    def _collect_done(self, slots: list[_Slot]) -> None:
        for s in slots:
            if s.future is not None and s.future.done():
                self._collect(s)

    def cut(self, ready: list[_Slot], budget: int | None) -> list[_Slot]:
        """``ready`` within the budget; the rest are cut unfinished."""
        if budget is None:
            return ready
        left = max(0, budget - self.taken)
        for slot in ready[left:]:
            self._submit(slot, slot.cut)
        return ready[:left]

    def advance(self, ready: list[_Slot], actions: list[Action]) -> None:
        self.taken += len(ready)
        for slot, action in zip(ready, actions):
            self._submit(slot, slot.step, action, slot.ep.traj.num_steps >= slot.ep.traj.task.step_limit)
