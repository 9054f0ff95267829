"""The live simulator: ``World(seed, config).reset(task) -> Screen`` and ``step(action) -> (Screen, done)``;
``step`` never raises (an action that does not apply changes nothing).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ipl_jax.coat.actions import DIRECTIONS
from ipl_jax.data.records import UIElement
from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps import CatalogApp, HomeApp, MessagesApp, PlainApp, SettingsApp
from ipl_jax.envs.synthetic.config import VARIANTS, WorldConfig
from ipl_jax.envs.synthetic.render import ScreenPainter
from ipl_jax.envs.synthetic.widgets import Widget, make_geometry

HOME = "Home"


@dataclasses.dataclass(frozen=True, eq=False)
class Screen:
    """One screen: its widgets (with pixel boxes), UI elements (screen fractions), app / page and a state
    summary. ``image`` renders lazily (and once); ``painter()`` is a picklable callable that renders it."""

    widgets: tuple[Widget, ...]
    size: tuple[int, int]  # (width, height) pixels
    theme: str
    app: str
    page: str
    state: dict
    base_size: int = 11
    render_size: tuple[int, int] | None = None  # (width, height) of the picture when it differs from ``size``

    @functools.cached_property
    def element_widgets(self) -> tuple[Widget, ...]:
        return tuple(w for w in self.widgets if w.is_element)

    @functools.cached_property
    def elements(self) -> tuple[UIElement, ...]:
        return tuple(
            UIElement(box=self.fraction_box(w), text=w.text, kind=w.kind, clickable=w.clickable)
            for w in self.element_widgets
        )

    def fraction_box(self, w: Widget) -> tuple[float, float, float, float]:
        W, H = self.size
        x1, y1, x2, y2 = w.box
        return (x1 / W, y1 / H, x2 / W, y2 / H)

    @property
    def picture_size(self) -> tuple[int, int]:
        """(width, height) of the rendered screenshot."""
        return tuple(self.render_size) if self.render_size else self.size

    def painter(self) -> ScreenPainter:
        items = tuple(w.paint_item() for w in self.widgets)
        return ScreenPainter(self.size, self.theme, items, self.base_size, self.render_size)

    @functools.cached_property
    def image(self):
        """The rendered PIL RGB image."""
        return self.painter()()

    def tap_target(self, x_px: float, y_px: float) -> Widget | None:
        """The clickable widget under a pixel point (the one drawn last wins)."""
        for w in reversed(self.widgets):
            if w.clickable and w.on_tap is not None and w.contains(x_px, y_px):
                return w
        return None

    def find(self, key: str) -> Widget | None:
        """The clickable element with internal key ``key`` (e.g. ``row:Wi-Fi``), or None."""
        for w in self.element_widgets:
            if w.clickable and w.key == key:
                return w
        return None

    def transitions(self) -> dict[str, str]:
        """For each clickable element text: what tapping it does ("A or B" when two elements share a text)."""
        effects: dict[str, list[str]] = {}
        for w in self.element_widgets:
            if w.clickable and w.text and w.effect and w.effect not in effects.get(w.text, ()):
                effects.setdefault(w.text, []).append(w.effect)
        return {text: " or ".join(e) for text, e in effects.items()}


class World:
    """A deterministic phone. Same ``seed``, ``config``, task and actions => the same screens."""

    def __init__(self, seed: int, config: WorldConfig | None = None):
        self.seed = int(seed)
        self.config = config or WorldConfig()
        self.rng = np.random.default_rng(self.seed)
        self.apps: dict = {}
        self.current = HOME
        self.done = False
        self.task = None
        self._screen: Screen | None = None

    # ------------------------------------------------------------------------------------------ setup

    def reset(self, task=None) -> Screen:
        """Draw a new phone and put it in ``task``'s start state (the home screen if task is None)."""
        from ipl_jax.envs.synthetic.tasks import prepare_world, task_requirements  # tasks imports this module

        rng, cfg = self.rng, self.config
        self.theme = cfg.themes[int(rng.integers(len(cfg.themes)))]
        self.variant = cfg.variants[int(rng.integers(len(cfg.variants)))]
        self.geo = make_geometry(cfg.width, cfg.height, cfg.font_size, VARIANTS[self.variant], rng, cfg.layout_jitter)
        req = task_requirements(task) if task is not None else {}
        lo, hi = cfg.n_extra_apps
        n_extra = min(len(content.EXTRA_APPS), int(rng.integers(lo, hi + 1)))
        need = [a for a in req.get("apps", ()) if a in content.EXTRA_APPS]
        pool = [a for a in content.EXTRA_APPS if a not in need]
        extras = need + [pool[i] for i in rng.permutation(len(pool))[: max(0, n_extra - len(need))]]
        names = list(content.CORE_APPS) + extras
        if cfg.shuffle_layout:
            order = [names[i] for i in rng.permutation(len(names))]
        else:
            order = [a for a in content.APP_ICONS if a in names]
        icons = dict((a, content.APP_ICONS[a]) for a in names)
        if cfg.randomize_icon_colors:
            icons = {a: (tuple(int(v) for v in rng.integers(30, 220, 3)), g) for a, (_, g) in icons.items()}
        clock = f"{int(rng.integers(6, 23))}:{int(rng.integers(60)):02d}"
        date = (
            f"{['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'][int(rng.integers(7))]} {int(rng.integers(1, 29))} "
            f"{['May', 'June', 'July'][int(rng.integers(3))]}"
        )
        self.clock = clock
        home = HomeApp(HOME, self)
        home.reset(rng, cfg, self.geo, order=order, icons=icons, clock=clock, date=date)
        self.apps = {HOME: home}
        settings = SettingsApp("Settings", self)
        settings.reset(rng, cfg, self.geo, required=req.get("settings", ()))
        self.apps["Settings"] = settings
        for name, store in (("Shop", False), ("Store", True)):
            app = CatalogApp(name, self, store=store)
            app.reset(rng, cfg, self.geo)
            self.apps[name] = app
        messages = MessagesApp("Messages", self)
        messages.reset(rng, cfg, self.geo, required=req.get("contacts", ()))
        self.apps["Messages"] = messages
        for name in extras:
            app = PlainApp(name, self)
            app.reset(rng, cfg, self.geo)
            self.apps[name] = app
        self.current, self.done, self.n_steps, self._toast = HOME, False, 0, None
        self.task = task
        if task is not None:
            prepare_world(self, task, rng)
        self._screen = self._build()
        return self._screen

    # ------------------------------------------------------------------------------------------ host API

    def launch(self, name: str) -> None:
        if name in self.apps and name != HOME:
            self.current = name
            self.apps[name].open()

    def go_home(self) -> None:
        self.current = HOME
        self.apps[HOME].open()

    def toast(self, text: str) -> None:
        self._toast = text

    def press_back(self) -> None:
        if not self.apps[self.current].back():
            self.go_home()

    @property
    def app(self):
        return self.apps[self.current]

    @property
    def screen(self) -> Screen:
        return self._screen

    # ------------------------------------------------------------------------------------------ stepping

    def step(self, action) -> tuple[Screen, bool]:
        """Apply one action. Never raises on a bad action: it simply changes nothing."""
        if self._screen is None:
            raise RuntimeError("World.step called before reset")
        if self.done:
            return self._screen, True
        self._toast = None
        self._apply(action)
        self.n_steps += 1
        self._screen = self._build()
        return self._screen, self.done

    def _apply(self, action) -> None:
        kind = getattr(action, "type", None)
        if not isinstance(kind, str):
            return
        if kind == "stop":
            self.done = True
        elif kind in ("click", "long_press"):
            point = _valid_point(getattr(action, "point", None))
            if point is not None:
                W, H = self._screen.size
                target = self._screen.tap_target(point[0] * W, point[1] * H)
                if target is not None:
                    target.on_tap()
        elif kind == "scroll":
            d = getattr(action, "direction", None)
            if d in DIRECTIONS:
                self.app.scroll(d)
        elif kind == "type":
            text = getattr(action, "text", None)
            if isinstance(text, str) and text:
                self.app.type_text(text)
        elif kind == "press":
            button = getattr(action, "button", None)
            if button == "back":
                self.press_back()
            elif button == "home":
                self.go_home()
            elif button == "enter":
                self.app.enter()
        elif kind == "open_app":
            text = getattr(action, "text", None)
            if isinstance(text, str):
                match = [a for a in self.apps if a != HOME and a.lower() == text.strip().lower()]
                if match:
                    self.launch(match[0])
        # "wait", "invalid" and unknown types change nothing

    def _build(self) -> Screen:
        g = self.geo
        settings = self.apps["Settings"]
        wifi = settings.values.get("Wi-Fi", False)
        widgets = [
            Widget(g.text_box(g.margin // 2, g.status_h // 2, self.clock, g.small), "text", self.clock, size=g.small),
            Widget((0, 0, g.width - 2, g.status_h), "status_icons", kind="", on=wifi),
        ]
        app = self.app
        widgets += app.widgets()
        if self._toast:
            w = min(g.width - 2 * g.margin, g.text_box(0, 0, self._toast)[2] + 16)
            y = g.bottom - g.margin - g.text_h - 8
            x = (g.width - w) // 2
            widgets.append(Widget((x, y, x + w, y + g.text_h + 6), "toast", self._toast))
        widgets.append(Widget((0, g.bottom, g.width, g.height), "navbar", kind="", on=g.nav_buttons))
        state = {"app": self.current, **app.state()}
        return Screen(
            widgets=tuple(widgets),
            size=(g.width, g.height),
            theme=self.theme,
            app=self.current,
            page=app.page,
            state=state,
            base_size=g.font_size,
            render_size=tuple(self.config.render_size) or None,
        )


def _valid_point(point) -> tuple[float, float] | None:
    try:
        x, y = (float(v) for v in point)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(x) and math.isfinite(y) and 0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        return None
    return (x, y)
