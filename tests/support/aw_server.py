"""A stand-in AndroidWorld server on localhost: the synthetic world behind AndroidWorld's HTTP API (the endpoints,
query parameters and JSON of ``server/android_server.py``; pixels as nested lists), so the AndroidWorld client is
tested end to end without an emulator.

Task types are the synthetic task families (the held-out ``toggle_pair`` aside); instance ``i`` of a type under
suite seed ``s`` is ``synthetic_task(s, type, i)``: a world seed and a task of that family. The server reads
AndroidWorld's JSON actions by AndroidWorld's own rules (``actuation.py``: ``scroll`` names the view's direction,
``swipe`` the finger's), written here independently of the client's mapping, with one difference: ``input_text``
does not press Enter after typing (the synthetic world's ``type`` does not, and parity with it is the point).

Faults: ``kill()`` stops serving (connections refused), ``die_on[endpoint] = n``: the n-th request to that endpoint
kills the server unanswered (a server dying mid-run), ``hang[endpoint] = seconds`` delays that endpoint's
answers, ``fail_init`` (a set of task types, or True for all) makes ``/task/initialize`` answer 500.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np

from ipl_jax.coat.actions import Action
from ipl_jax.envs.synthetic.config import FAMILIES, WorldConfig
from ipl_jax.envs.synthetic.tasks import HELD_OUT_FAMILIES, is_done, sample_task
from ipl_jax.envs.synthetic.world import World

TASK_TYPES = tuple(f for f in FAMILIES if f not in HELD_OUT_FAMILIES)
FAMILY_NAMES = ("android_world", "synthetic")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_ACTION_TYPES = (
    "click double_tap long_press scroll swipe input_text navigate_home navigate_back keyboard_enter open_app "
    "wait status answer unknown"
).split()
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


def synthetic_task(seed: int, task_type: str, idx: int, config: WorldConfig | None = None):
    """(world seed, Task, WorldConfig) of instance ``idx`` of ``task_type`` in the suite of ``seed``."""
    cfg = WorldConfig(task_weights=(f"{task_type}:1",)) if config is None else config
    world_seed = zlib.crc32(f"{seed}_{task_type}_{idx}".encode())
    return world_seed, sample_task(np.random.default_rng([world_seed, 2]), cfg), cfg


class HTTPError(Exception):
    def __init__(self, status: int, detail):
        super().__init__(detail)
        self.status, self.detail = status, detail


class SyntheticAndroidWorld:
    """The server's state: the suite, the one world (one emulator), fault hooks; ``url`` once started."""

    def __init__(self, n_task_combinations: int = 2, seed: int = 42):
        self.lock = threading.Lock()
        self.hang: dict[str, float] = {}
        self.die_on: dict[str, int] = {}
        self.fail_init: bool | set = False
        self.requests: list[str] = []  # "METHOD /endpoint" in the order served
        self.actions: list[dict] = []  # the JSON actions executed
        self._suite(n_task_combinations, seed)
        self.world = self.task = None
        self.httpd = None

    def _suite(self, n: int, seed: int) -> None:
        self.n_task_combinations, self.seed = int(n), int(seed)

    # ------------------------------------------------------------------------------------------ serving

    def start(self) -> SyntheticAndroidWorld:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                state._handle(self, "GET")

            def do_POST(self):
                state._handle(self, "POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def kill(self) -> None:
        """Stop serving: later connections are refused."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parsed = urlparse(h.path)
        endpoint, query = parsed.path, {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        self.requests.append(f"{method} {endpoint}")
        if self.die_on.get(endpoint) == self.requests.count(f"{method} {endpoint}"):
            self.kill()  # the connection closes unanswered; later ones are refused
            return
        delay = self.hang.get(endpoint, 0.0)
        if delay:
            time.sleep(delay)
        route = ROUTES.get(endpoint)
        try:
            if route is None:
                raise HTTPError(404, "Not Found")
            if route[0] != method:
                raise HTTPError(405, "Method Not Allowed")
            body = None
            if method == "POST" and int(h.headers.get("Content-Length") or 0):
                body = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
            with self.lock:
                status, answer = 200, route[1](self, query, body)
        except HTTPError as e:
            status, answer = e.status, {"detail": e.detail}
        except Exception as e:  # what FastAPI answers for an exception in an endpoint
            status, answer = 500, {"detail": f"Internal Server Error: {type(e).__name__}: {e}"}
        data = json.dumps(answer, separators=(",", ":")).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        try:
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timed out)
            pass

    # ------------------------------------------------------------------------------------------ endpoints

    def _instance(self, q: dict):
        task_type, idx = _param(q, "task_type", str), _param(q, "task_idx", int)
        if task_type not in TASK_TYPES or not 0 <= idx < self.n_task_combinations:
            raise KeyError(f"{task_type!r} {idx}")  # AndroidWorld's suite lookup raises: a 500
        return task_type, idx

    def reset(self, q, body):
        if _param(q, "go_home", bool) and self.world is not None:
            self.world.go_home()
        return {"status": "success", "message": f"Environment reset with go_home={q['go_home']}."}

    def screenshot(self, q, body):
        _param(q, "wait_to_stabilize", bool)
        if self.world is None:  # no task yet: a home screen
            self.world = World(0)
            self.world.reset()
        return {"pixels": np.asarray(self.world.screen.image.convert("RGB")).tolist()}

    def execute_action(self, q, body):
        if not isinstance(body, dict) or body.get("action_type") not in _ACTION_TYPES:
            raise ValueError(f"Invalid action type: {body and body.get('action_type')}")
        self.actions.append(dict(body))
        for action in self._world_actions(body):
            self.world.step(action)
        return {"status": "success", "message": f"Action {body} executed."}

    def _world_actions(self, d: dict) -> list[Action]:
        """AndroidWorld's gesture as synthetic-world actions (pixels -> the fraction at the pixel's centre)."""
        t, (w, h) = d["action_type"], self.world.screen.picture_size
        at = None
        if d.get("x") is not None and d.get("y") is not None:
            at = ((int(d["x"]) + 0.5) / w, (int(d["y"]) + 0.5) / h)
        if t in ("click", "double_tap", "long_press"):
            if at is None:
                raise ValueError(f"Invalid click action: {d}")  # index: this server lists no elements
            return [Action(type="click" if t != "long_press" else "long_press", point=at)] * (
                2 if t == "double_tap" else 1
            )
        if t == "input_text":
            return ([Action(type="click", point=at)] if at else []) + [Action(type="type", text=d.get("text") or "")]
        if t in ("scroll", "swipe"):
            finger = _OPPOSITE[d["direction"]] if t == "scroll" else d["direction"]
            return [Action(type="scroll", direction=finger)]
        button = {"navigate_back": "back", "navigate_home": "home", "keyboard_enter": "enter"}.get(t)
        if button:
            return [Action(type="press", button=button)]
        if t == "open_app":
            if not d.get("app_name"):
                raise ValueError("No app name provided")
            return [Action(type="open_app", text=d["app_name"])]
        if t == "status":
            return [Action(type="stop")]
        return []  # wait, answer, unknown

    def task_list(self, q, body):
        n = _param(q, "max_index", int)
        return {"task_list": list(TASK_TYPES) if n > len(TASK_TYPES) or n < 0 else list(TASK_TYPES[:n])}

    def task_length(self, q, body):
        if _param(q, "task_type", str) not in TASK_TYPES:
            raise KeyError(q["task_type"])
        return {"length": self.n_task_combinations}

    def reinitialize(self, q, body):
        n, seed = int(q.get("n_task_combinations", 2)), int(q.get("seed", 42))
        if q.get("task_family", "android_world") not in FAMILY_NAMES:
            raise HTTPError(400, f"Invalid task family: {q['task_family']}")
        self._suite(n, seed)
        return {"status": "success", "message": f"Task suite re-initialized with n_task_combinations={n}, seed={seed}."}

    def initialize(self, q, body):
        task_type, idx = self._instance(q)
        if self.fail_init is True or (isinstance(self.fail_init, set) and task_type in self.fail_init):
            raise RuntimeError(f"could not initialise {task_type} {idx}")
        world_seed, self.task, cfg = synthetic_task(self.seed, task_type, idx)
        self.world = World(world_seed, cfg)
        self.world.reset(self.task)
        return {"status": "success", "message": f"Task {task_type} {idx} initialized."}

    def tear_down(self, q, body):
        task_type, idx = self._instance(q)
        self.world = self.task = None
        return {"status": "success", "message": f"Task {task_type} {idx} torn down."}

    def score(self, q, body):
        self._instance(q)
        return {"score": float(self.task is not None and is_done(self.world, self.task))}

    def goal(self, q, body):
        task_type, idx = self._instance(q)
        return {"goal": synthetic_task(self.seed, task_type, idx)[1].instruction}

    def template(self, q, body):
        task_type, idx = self._instance(q)
        return {"template": synthetic_task(self.seed, task_type, idx)[1].family}

    def close(self, q, body):
        return {"status": "success"}

    def health(self, q, body):
        return {"status": "success"}


def _param(q: dict, name: str, kind):
    """A required query parameter, read as FastAPI reads it (422 when missing or malformed)."""
    if name not in q:
        raise HTTPError(422, [{"type": "missing", "loc": ["query", name], "msg": "Field required"}])
    v = q[name]
    if kind is bool and v.lower() in _TRUE + _FALSE:
        return v.lower() in _TRUE
    if kind is int and v.lstrip("-").isdigit():
        return int(v)
    if kind is str:
        return v
    raise HTTPError(422, [{"type": f"{kind.__name__}_parsing", "loc": ["query", name], "input": v}])


S = SyntheticAndroidWorld
ROUTES = {
    "/reset": ("POST", S.reset),
    "/screenshot": ("GET", S.screenshot),
    "/execute_action": ("POST", S.execute_action),
    "/suite/task_list": ("GET", S.task_list),
    "/suite/task_length": ("GET", S.task_length),
    "/suite/reinitialize": ("GET", S.reinitialize),
    "/task/initialize": ("POST", S.initialize),
    "/task/tear_down": ("POST", S.tear_down),
    "/task/score": ("GET", S.score),
    "/task/goal": ("GET", S.goal),
    "/task/template": ("GET", S.template),
    "/close": ("POST", S.close),
    "/health": ("GET", S.health),
}
