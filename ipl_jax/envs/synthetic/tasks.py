"""Tasks: families, instruction templates, held-out rules, start states and goal checks. Held-out templates,
entity combinations and the ``toggle_pair`` family occur only in ``test_task_unseen``.
"""

from __future__ import annotations

import dataclasses
import zlib

from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps.catalog import normalize_query
from ipl_jax.envs.synthetic.config import FAMILIES

HELD_OUT_FAMILIES = ("toggle_pair",)
N_HELD_OUT_TEMPLATES = 2
SUBSET = {
    "open_app": "single",
    "toggle": "google_apps",
    "sub_toggle": "google_apps",
    "toggle_pair": "google_apps",
    "search_open": "web_shopping",
    "add_to_cart": "web_shopping",
    "install": "install",
    "send_message": "general",
}
START_STATES = ("home", "other_app", "in_app")

# The last N_HELD_OUT_TEMPLATES of each list are held out for test_task_unseen.
TEMPLATES = {
    "open_app": (
        "open {app}",
        "open the {app} app",
        "launch {app}",
        "go to the {app} app",
        "start {app}",
        "show me the {app} app",
        "bring up {app} please",
        "I want to use {app}",
    ),
    "toggle": (
        "turn {state} {setting}",
        "switch {setting} {state}",
        "{enable} {setting}",
        "set {setting} to {state}",
        "open Settings and turn {setting} {state}",
        "please turn {setting} {state}",
        "make sure {setting} is {state}",
        "I need {setting} switched {state}",
    ),
    "sub_toggle": (
        "turn {state} {setting}",
        "in {menu} settings, turn {setting} {state}",
        "{enable} {setting} in the {menu} settings",
        "switch {setting} {state}",
        "go to Settings, {menu}, and turn {setting} {state}",
        "make sure {setting} under {menu} is {state}",
        "I need {setting} switched {state}",
    ),
    "toggle_pair": (
        "turn {state} {setting} and turn {state2} {setting2}",
        "switch {setting} {state}, then {setting2} {state2}",
        "set {setting} to {state} and {setting2} to {state2}",
    ),
    "search_open": (
        "search for {query} and open the first result",
        "find {query} in Shop and open the first result",
        "look up {query} in the Shop app and show the top result",
        "open the first Shop result for {query}",
        "search Shop for {query}, then open the first item",
        "show me the first {query} item in Shop",
        "I want to see the top result for {query} in Shop",
    ),
    "add_to_cart": (
        "search for {query} and add the first result to the cart",
        "add the first {query} result to my cart",
        "in Shop, find {query} and put the first result in the cart",
        "put the top {query} result in the Shop cart",
        "search Shop for {query} and add the first item to the cart",
        "I'd like the first {query} result in my cart",
        "add the top search result for {query} to the cart",
    ),
    "install": (
        "install {app}",
        "install the {app} app from the Store",
        "get {app} from the Store",
        "download {app}",
        "find {app} in the Store and install it",
        "I want the {app} app on my phone",
        "put {app} on this phone",
    ),
    "send_message": (
        'send "{message}" to {contact}',
        'text {contact} "{message}"',
        'tell {contact} "{message}" in Messages',
        'write "{message}" to {contact}',
        'message {contact} saying "{message}"',
        'let {contact} know "{message}"',
        'reply "{message}" to {contact}',
    ),
}


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: its family, its instruction text (from template number ``template``), where the episode
    starts, and the family's parameters."""

    family: str
    instruction: str
    template: int
    start: str = "home"
    app: str = ""
    setting: str = ""
    on: bool = True
    setting2: str = ""
    on2: bool = True
    query: str = ""
    contact: str = ""
    message: str = ""

    @property
    def subset(self) -> str:
        return SUBSET[self.family]

    @property
    def target_app(self) -> str:
        if self.family in ("toggle", "sub_toggle", "toggle_pair"):
            return "Settings"
        if self.family in ("search_open", "add_to_cart"):
            return "Shop"
        if self.family == "install":
            return "Store"
        if self.family == "send_message":
            return "Messages"
        return self.app

    def combo_key(self) -> str:
        """The entity combination, independent of wording and start state."""
        parts = {
            "open_app": (self.app,),
            "toggle": (self.setting, self.on),
            "sub_toggle": (self.setting, self.on),
            "toggle_pair": (self.setting, self.on, self.setting2, self.on2),
            "search_open": (self.query,),
            "add_to_cart": (self.query,),
            "install": (self.app,),
            "send_message": (self.contact, self.message),
        }[self.family]
        return self.family + ":" + "|".join(str(p) for p in parts)

    @property
    def held_out_combo(self) -> bool:
        return zlib.crc32(self.combo_key().encode()) % 5 == 0

    @property
    def held_out_template(self) -> bool:
        return self.template >= len(TEMPLATES[self.family]) - N_HELD_OUT_TEMPLATES

    @property
    def unseen(self) -> bool:
        """True if this task may only appear in test_task_unseen."""
        return self.family in HELD_OUT_FAMILIES or self.held_out_template or self.held_out_combo

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> Task:
        return Task(**d)


def instruction_text(family: str, template: int, **params) -> str:
    st = "on" if params.get("on", True) else "off"
    st2 = "on" if params.get("on2", True) else "off"
    fields = dict(
        params,
        state=st,
        state2=st2,
        enable="enable" if st == "on" else "disable",
        menu=content.SUBMENU_OF.get(params.get("setting", ""), ""),
    )
    text = TEMPLATES[family][template].format(**fields)
    return text[0].upper() + text[1:]


def _draw_params(family: str, rng) -> dict:
    pick = lambda seq: seq[int(rng.integers(len(seq)))]
    if family == "open_app":
        return dict(app=pick(tuple(content.APP_ICONS)))
    if family == "toggle":
        return dict(setting=pick(content.MAIN_TOGGLES), on=bool(rng.random() < 0.5))
    if family == "sub_toggle":
        return dict(setting=pick(content.SUB_TOGGLES), on=bool(rng.random() < 0.5))
    if family == "toggle_pair":
        i, j = rng.permutation(len(content.MAIN_TOGGLES))[:2]
        return dict(
            setting=content.MAIN_TOGGLES[i],
            on=bool(rng.random() < 0.5),
            setting2=content.MAIN_TOGGLES[j],
            on2=bool(rng.random() < 0.5),
        )
    if family in ("search_open", "add_to_cart"):
        return dict(query=f"{pick(content.COLOURS)} {pick(content.ITEMS)}".lower())
    if family == "install":
        return dict(app=pick(content.STORE_APPS))
    if family == "send_message":
        return dict(contact=pick(content.CONTACTS), message=pick(content.MESSAGE_TEXTS))
    raise ValueError(f"unknown task family {family!r}")


def sample_task(rng, config, unseen: bool = False) -> Task:
    """A random task: never held out with ``unseen=False``; at least one held-out part with ``unseen=True``."""
    weights = config.family_weights()
    fams = [f for f in FAMILIES if f not in HELD_OUT_FAMILIES and weights.get(f, 0) > 0]
    w = [weights[f] for f in fams]
    if unseen:
        fams += list(HELD_OUT_FAMILIES)
        w += [sum(w) / len(w)] * len(HELD_OUT_FAMILIES)
    total = sum(w)
    family = fams[int(rng.choice(len(fams), p=[x / total for x in w]))]
    n_t = len(TEMPLATES[family])
    mode = "family" if family in HELD_OUT_FAMILIES else ("template" if rng.random() < 0.5 else "combo")
    for _ in range(1000):
        params = _draw_params(family, rng)
        if not unseen:
            template = int(rng.integers(n_t - N_HELD_OUT_TEMPLATES))
        elif mode == "template":
            template = n_t - N_HELD_OUT_TEMPLATES + int(rng.integers(N_HELD_OUT_TEMPLATES))
        else:
            template = int(rng.integers(n_t)) if mode == "family" else int(rng.integers(n_t - N_HELD_OUT_TEMPLATES))
        task = Task(
            family=family, instruction=instruction_text(family, template, **params), template=template, **params
        )
        if not unseen and not task.unseen:
            break
        if unseen and task.unseen and (mode != "combo" or task.held_out_combo):
            break
    else:
        raise RuntimeError(f"sample_task: could not draw a {'held-out' if unseen else 'seen'} {family} task")
    u = rng.random()
    start = (
        "home"
        if u < config.p_start_home
        else ("other_app" if u < config.p_start_home + config.p_start_other_app else "in_app")
    )
    return dataclasses.replace(task, start=start)


# ---------------------------------------------------------------------------------------------- world hooks


def task_requirements(task: Task) -> dict:
    """What the phone must contain for the task: extra apps, settings main-list rows, contacts."""
    req = {"apps": [], "settings": [], "contacts": []}
    if task.family == "open_app":
        req["apps"].append(task.app)
    for s in (task.setting, task.setting2):
        if s:
            req["settings"].append(content.SUBMENU_OF.get(s, s))
    if task.contact:
        req["contacts"].append(task.contact)
    return req


def prepare_world(world, task: Task, rng) -> None:
    """Set the task's initial conditions (switches start in the wrong state) and its start screen."""
    settings = world.apps["Settings"]
    if task.setting:
        settings.values[task.setting] = not task.on
    if task.setting2:
        settings.values[task.setting2] = not task.on2
    target = task.target_app
    home = world.apps["Home"]
    if home.n_pages > 1 and rng.random() < 0.5:  # the launcher shows the page it was left on
        home.index = int(rng.integers(home.n_pages))
    start = task.start
    if start == "in_app" and task.family == "open_app":
        start = "other_app"
    if start == "other_app":
        others = [a for a in world.apps if a not in ("Home", target)]
        world.launch(others[int(rng.integers(len(others)))])
    elif start == "in_app":
        world.launch(target)
        app = world.apps[target]
        if target == "Settings":
            pages = [r for r in settings.rows if r in content.SUBMENUS or r in content.INFO_ROWS]
            pages = [p for p in pages if p != content.SUBMENU_OF.get(task.setting)]
            if pages:
                app.page = pages[int(rng.integers(len(pages)))]
        elif target in ("Shop", "Store"):
            app.show(app._random_item(rng))
        elif target == "Messages":
            others = [c for c in app.contacts if c != task.contact]
            if others:
                app.chat(others[int(rng.integers(len(others)))])


def is_done(world, task: Task) -> bool:
    """Whether the task's goal holds in the world's current state."""
    f = task.family
    if f == "open_app":
        return world.current == task.app
    if f in ("toggle", "sub_toggle"):
        return world.apps["Settings"].values[task.setting] == task.on
    if f == "toggle_pair":
        v = world.apps["Settings"].values
        return v[task.setting] == task.on and v[task.setting2] == task.on2
    if f in ("search_open", "add_to_cart"):
        shop = world.apps["Shop"]
        first = shop.first_result(task.query)
        if f == "add_to_cart":
            return first is not None and first in shop.cart
        return (
            world.current == "Shop"
            and shop.page == "details"
            and shop.query == normalize_query(task.query)
            and shop.item == first
        )
    if f == "install":
        return task.app in world.apps["Store"].installed
    if f == "send_message":
        return (task.contact, task.message) in world.apps["Messages"].sent
    raise ValueError(f"unknown task family {f!r}")
