"""CoaT annotations from the world state, with seeded paraphrase variety and short texts: ``describe_screen`` (s1,
<= 40 words), ``think`` (s2, <= 35 words), ``action_result``. s3 and s4 are ``format_action`` / ``format_grounding``.
"""

from __future__ import annotations

from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.expert import Decision
from ipl_jax.envs.synthetic.tasks import Task

MAX_DESC_WORDS = 40
MAX_THINK_WORDS = 35


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _n_words(text: str) -> int:
    return len(text.split())


def _region(y_frac: float, rng_words) -> str:
    top, mid, low = rng_words
    return top if y_frac < 1 / 3 else (mid if y_frac < 2 / 3 else low)


# ---------------------------------------------------------------------------------------------- s1


def page_name(screen) -> str:
    """The page phrase of a screen as descriptions name it ("the Settings list", "the chat with Anna", "Shop results
    for lamp"); also kept in each step's ``meta["page_name"]``, the ground truth of the page-reading score."""
    app, page, st = screen.app, screen.page, screen.state
    if app == "Home":
        return "the home screen" + (f", page {st['home_page'] + 1}" if st.get("n_home_pages", 1) > 1 else "")
    if app == "Settings":
        if page == "main":
            return "the Settings list"
        return f"the {page} settings" if page in content.SUBMENUS else f"the {page} page in Settings"
    if app in ("Shop", "Store"):
        if page == "results":
            return f"{app} results for {st['query']}"
        if page == "details":
            return f"the {app} page of {st['item']}"
        return f"the {app} start page"
    if app == "Messages":
        return f"the chat with {st['contact']}" if page == "chat" else "the Messages contact list"
    return f"the {app} app"


def _element_phrase(screen, w) -> str | None:
    """How one element is named in a description (None: left out)."""
    if w.style in ("title", "subtle") or w.kind == "ICON_ARROW_BACKWARD":
        return None
    if w.kind == "ICON_TOGGLE":
        return None  # folded into its label below
    if w.style == "field":
        return f'box "{w.text}"' if w.glyph == "filled" else f"{w.text} box"
    if w.style in ("button", "button2"):
        return f"{w.text} button"
    return w.text


def describe_screen(screen, rng) -> str:
    """s1: what the screen shows and roughly where, at most MAX_DESC_WORDS words."""
    W, H = screen.size
    switches = {
        w.key[len("switch:") :]: "on" if w.on else "off" for w in screen.element_widgets if w.key.startswith("switch:")
    }
    regions = _pick(rng, (("top", "middle", "bottom"), ("upper part", "centre", "lower part")))
    groups: dict[str, list[str]] = {}
    for w in screen.element_widgets:
        if w.box[1] < screen.size[1] * 0.045 and w.style == "text":
            continue  # the status-bar clock
        phrase = _element_phrase(screen, w)
        if not phrase:
            continue
        if w.style == "label":
            state = switches.get(w.text)
            if state is not None:
                phrase = f"{phrase} {state}"
        cy = (w.box[1] + w.box[3]) / 2 / H
        groups.setdefault(_region(cy, regions), []).append(phrase)
    head = _pick(rng, ("This is {p}.", "The screen shows {p}.", "{P}."))
    name = page_name(screen)
    text = head.format(p=name, P=name[0].upper() + name[1:])
    budget = MAX_DESC_WORDS - _n_words(text)
    parts = []
    for region in regions:
        items = groups.get(region, [])
        if not items:
            continue
        label = f"{region[0].upper() + region[1:]}:" if not parts else f"{region}:"
        chosen = []
        cost = _n_words(label)
        for item in items:
            c = _n_words(item)
            if cost + c > budget - 2:
                break
            chosen.append(item)
            cost += c
        if not chosen:
            break
        more = len(chosen) < len(items)
        parts.append(label + " " + ", ".join(chosen) + (" and more" if more else ""))
        budget -= cost + (2 if more else 0)
        if more:
            break
    if parts:
        text += " " + "; ".join(parts) + "."
    return text


# ---------------------------------------------------------------------------------------------- s2


def _words(d: Decision) -> str:
    """The action in words, present tense ("tap Wi-Fi")."""
    a = d.action
    if a.type == "click":
        return f"tap {a.target}"
    if a.type == "scroll":
        return f"scroll {a.direction}"
    if a.type == "type":
        return f'type "{a.text}"'
    if a.type == "press":
        return f"press {a.button}"
    return "stop"


def _done_phrase(prev: Decision | None, rng) -> str:
    if prev is None:
        return _pick(rng, ("Nothing is done yet.", "I am just starting.", "No action so far."))
    a, s = prev.action, prev.subject
    if prev.intent == "open_app":
        past = f"opened {s}"
    elif a.type == "click":
        past = f"tapped {a.target}"
    elif a.type == "scroll":
        past = f"scrolled {a.direction}"
    elif a.type == "type":
        past = f'typed "{a.text}"'
    elif a.type == "press":
        past = {"back": "went back", "home": "went home", "enter": "pressed enter"}[a.button]
    else:
        past = "finished"
    return _pick(rng, ("I {x}.", "Last I {x}.", "So far I {x}.")).format(x=past)


# What the step needs, by the expert's intent: fixed, or about the decision's subject ``s``.
_NEED = {
    "stop": "the task is complete",
    "back_out": "this page is not the one I need",
    "type": "the box is ready and empty",
    "submit": "the query is typed",
    "add": "this is the first result",
    "send": "the message is typed",
}
_NEED_OF_SUBJECT = {
    "open_app": "{s} is on this page",
    "next_home_page": "{s} is not on this page",
    "find": "{s} is not visible yet",
    "focus": 'I must enter "{s}"',
    "install": "this is {s}",
    "open_chat": "{s} is in the list",
}


def _need_phrase(task: Task, d: Decision, screen) -> str:
    s, i = d.subject, d.intent
    if i in _NEED:
        return _NEED[i]
    if i in _NEED_OF_SUBJECT:
        return _NEED_OF_SUBJECT[i].format(s=s)
    if i == "go_home":
        return f"this is not {task.target_app}" if screen.app != "Home" else "I must start over"
    if i == "toggle":
        want = task.on if s == task.setting else task.on2
        return f"{s} is {'off' if want else 'on'} but must be {'on' if want else 'off'}"
    if i == "open_menu":
        return f"{s} is inside {content.SUBMENU_OF[s]}"
    if i == "open_result":
        return f"{s} is the result I want" if task.family == "install" else f"the first result is {s}"
    raise ValueError(f"unknown intent {i!r}")


def think(task: Task, prev: Decision | None, screen, d: Decision, rng) -> str:
    """s2: what I did, what I see, what I need, what I do next; at most MAX_THINK_WORDS words."""
    done = _done_phrase(prev, rng)
    page = page_name(screen)
    seen = _pick(rng, ("Now I see {p};", "The screen shows {p};", "This is {p};")).format(p=page)
    need = _need_phrase(task, d, screen)
    nxt = _pick(rng, ("so next I {a}.", "so I will {a}.", "next I {a}.")).format(a=_words(d))
    text = f"{done} {seen} {need}, {nxt}"
    if _n_words(text) > MAX_THINK_WORDS:
        text = f"{seen[0].upper()}{seen[1:]} {need}, {nxt}"
    if _n_words(text) > MAX_THINK_WORDS:
        text = f"{need[0].upper()}{need[1:]}, {nxt}"
    return text


# ---------------------------------------------------------------------------------------------- result


def action_result(d: Decision, rng) -> str:
    """coat_action_result: what the action does."""
    a = d.action
    if a.type == "click":
        lead = _pick(rng, ("Tapping {t}", "A tap on {t}")).format(t=a.target)
        return f"{lead} {d.effect or 'changes nothing'}."
    if a.type == "scroll":
        if d.intent == "next_home_page":
            return f"Swiping {a.direction} shows another home page."
        return f"Scrolling {a.direction} shows {'later' if a.direction == 'up' else 'earlier'} rows of the list."
    if a.type == "type":
        return f'Typing puts "{a.text}" in the box.'
    if a.type == "press":
        return {
            "back": "Pressing back leaves this page.",
            "home": "Pressing home shows the home screen.",
            "enter": "Pressing enter runs the search.",
        }[a.button]
    return "Stopping ends the task."
