"""The scripted expert: the next golden action of a task from the live world state (closed loop, so it recovers
from any start state). Clicks carry ``point`` (box centre), ``box`` and ``target`` text, in screen fractions.
"""

from __future__ import annotations

import dataclasses

from ipl_jax.coat.actions import Action, box_center
from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps.catalog import normalize_query
from ipl_jax.envs.synthetic.tasks import Task, is_done
from ipl_jax.envs.synthetic.world import HOME

# Intents name why an action is taken; coat.py turns them into thoughts.
INTENTS = (
    "stop",
    "go_home",
    "back_out",
    "open_app",
    "next_home_page",
    "find",
    "toggle",
    "open_menu",
    "focus",
    "type",
    "submit",
    "open_result",
    "add",
    "install",
    "open_chat",
    "send",
)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The expert's action, why (``intent``), and what about (``subject``: an app, setting, query, ...)."""

    action: Action
    intent: str
    subject: str = ""
    effect: str = ""  # what a click does, from the tapped widget


def _click(world, key: str, intent: str, subject: str) -> Decision:
    screen = world.screen
    w = screen.find(key)
    if w is None:
        raise RuntimeError(f"expert: no clickable element {key!r} on {screen.app}/{screen.page}")
    box = screen.fraction_box(w)
    return Decision(Action(type="click", point=box_center(box), box=box, target=w.text), intent, subject, w.effect)


def _scroll(direction: str, subject: str, intent: str = "find") -> Decision:
    return Decision(Action(type="scroll", direction=direction), intent, subject)


def _press(button: str, intent: str, subject: str = "") -> Decision:
    return Decision(Action(type="press", button=button), intent, subject)


def _scroll_to(view, index: int, subject: str):
    """None if row ``index`` is visible, else the scroll that brings it closer."""
    if view.is_visible(index):
        return None
    return _scroll("up" if index >= view.offset else "down", subject)


def _open_app(world, name: str) -> Decision:
    if world.current != HOME:
        return _press("home", "go_home", name)
    home = world.apps[HOME]
    page = home.page_of(name)
    if page != home.index:
        return _scroll("left" if page > home.index else "right", name, "next_home_page")
    return _click(world, f"app:{name}", "open_app", name)


def _settings(world, setting: str) -> Decision:
    s = world.apps["Settings"]
    menu = content.SUBMENU_OF.get(setting)
    if menu is not None and s.page == menu:
        return _click(world, f"row:{setting}", "toggle", setting)
    if s.page != "main":
        return _press("back", "back_out", menu or setting)
    row = menu or setting
    move = _scroll_to(s.list, s.row_index(row), row)
    if move is not None:
        return move
    return _click(world, f"row:{row}", "open_menu" if menu else "toggle", setting)


def _search(world, app, query: str, typed: str) -> Decision:
    """Get a catalog app to the results page of ``query`` (the box is empty after a launch)."""
    if not app.focused:
        if app.page == "details":
            return _press("back", "back_out", typed)
        return _click(world, "field", "focus", typed)
    if not app.field:
        return Decision(Action(type="type", text=typed), "type", typed)
    if normalize_query(app.field) == query:
        return _press("enter", "submit", typed)
    return _press("home", "go_home", app.name)  # a wrong query in the box: relaunching clears it


def _shop(world, task: Task) -> Decision:
    shop = world.apps["Shop"]
    q = normalize_query(task.query)
    first = shop.first_result(q)
    if shop.page == "details" and not shop.focused:
        if shop.item == first and shop.query == q:
            return _click(world, "primary", "add", first)
        return _press("back", "back_out", task.query)
    if shop.page == "results" and shop.query == q and not shop.focused:
        move = _scroll_to(shop.list, 0, first)
        return move if move is not None else _click(world, f"result:{first}", "open_result", first)
    return _search(world, shop, q, task.query)


def _store(world, task: Task) -> Decision:
    store = world.apps["Store"]
    q = normalize_query(task.app)
    if store.page == "details" and not store.focused:
        if store.item == task.app:
            return _click(world, "primary", "install", task.app)
        return _press("back", "back_out", task.app)
    if store.page == "results" and store.query == q and not store.focused and task.app in store.results:
        k = store.results.index(task.app)
        move = _scroll_to(store.list, k // 2 if world.geo.variant.results_grid else k, task.app)
        return move if move is not None else _click(world, f"result:{task.app}", "open_result", task.app)
    return _search(world, store, q, task.app)


def _messages(world, task: Task) -> Decision:
    m = world.apps["Messages"]
    if m.page == "chat":
        if m.contact != task.contact:
            return _press("back", "back_out", task.contact)
        if not m.focused:
            return _click(world, "field", "focus", task.message)
        if not m.field:
            return Decision(Action(type="type", text=task.message), "type", task.message)
        if m.field.strip() == task.message:
            return _click(world, "send", "send", task.message)
        return _press("back", "back_out", task.contact)  # wrong text typed: leaving the chat clears it
    move = _scroll_to(m.list, m.contact_index(task.contact), task.contact)
    return move if move is not None else _click(world, f"contact:{task.contact}", "open_chat", task.contact)


def expert_decision(world, task: Task) -> Decision:
    """The golden next action for ``task`` in the world's current state."""
    if is_done(world, task):
        return Decision(Action(type="stop"), "stop", task.target_app)
    target = task.target_app
    if world.current != target:
        return _open_app(world, target)
    f = task.family
    if f in ("toggle", "sub_toggle"):
        return _settings(world, task.setting)
    if f == "toggle_pair":
        v = world.apps["Settings"].values
        return _settings(world, task.setting if v[task.setting] != task.on else task.setting2)
    if f in ("search_open", "add_to_cart"):
        return _shop(world, task)
    if f == "install":
        return _store(world, task)
    if f == "send_message":
        return _messages(world, task)
    raise RuntimeError(f"expert: no plan for family {f!r} in app {world.current}")
