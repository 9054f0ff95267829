"""What every app shares: the host interface, a page header, and a scrollable list viewport."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ipl_jax.envs.synthetic.widgets import Geometry, Widget


class Host(Protocol):
    """What an app may ask of the world."""

    def launch(self, name: str) -> None: ...

    def toast(self, text: str) -> None: ...

    def press_back(self) -> None: ...


class App:
    """A state machine with pages. Subclasses set ``root_page`` and implement ``widgets``. Event methods return True
    when they changed something (False from ``back``: the world goes home).
    """

    root_page = "main"

    def __init__(self, name: str, host: Host):
        self.name, self.host = name, host
        self.page = self.root_page

    def reset(self, rng, config, geo: Geometry) -> None:
        """Draw this episode's content (orders, states) from ``rng``."""
        self.geo = geo

    def open(self) -> None:
        """Launch from the home screen: a cold start on the root page."""
        self.page = self.root_page

    def widgets(self) -> list[Widget]:
        raise NotImplementedError

    def scroll(self, direction: str) -> bool:
        return False

    def back(self) -> bool:
        if self.page != self.root_page:
            self.page = self.root_page
            return True
        return False

    def type_text(self, text: str) -> bool:
        return False

    def enter(self) -> bool:
        return False

    def state(self) -> dict:
        """A JSON-ready summary of the app state (for Screen.state and debugging)."""
        return {"page": self.page}


def clean_typed(text: str) -> str:
    """Typed text as a one-line field shows it: control characters (newlines, tabs, ...) become spaces."""
    return "".join(c if c.isprintable() else " " for c in text)


def header(geo: Geometry, title: str, host: Host, back: bool) -> list[Widget]:
    """The page header: background, optional back arrow (presses back), title."""
    y1, y2 = geo.status_h, geo.status_h + geo.header_h
    out = [Widget((0, y1, geo.width, y2), "header_bg", kind="")]
    x = geo.margin
    if back:
        s = geo.header_h
        bw = max(16, int(s * 0.7))
        out.append(
            Widget(
                (2, y1 + (s - bw) // 2, 2 + bw, y1 + (s - bw) // 2 + bw),
                "back",
                kind="ICON_ARROW_BACKWARD",
                clickable=True,
                on_tap=host.press_back,
                effect="goes back to the previous page",
            )
        )
        x = 4 + bw
    cy = (y1 + y2) // 2
    box = geo.text_box(x, cy, title, geo.title, max_width=geo.width - x - geo.margin)
    if geo.variant.title_centered:
        w = box[2] - box[0]
        x = max(x, (geo.width - w) // 2)
        box = (x, box[1], min(geo.width, x + w), box[3])
    out.append(Widget(box, "title", title, size=geo.title))
    return out


@dataclasses.dataclass
class ListView:
    """A vertical list of ``n`` rows of ``row_h`` pixels shown from pixel row ``top`` to ``bottom``.

    ``offset`` is the first visible row (only whole rows show). A swipe moves ``visible - 2`` rows (at least one):
    finger up shows later rows.
    """

    n: int
    top: int
    bottom: int
    row_h: int
    offset: int = 0

    @property
    def visible(self) -> int:
        return max(1, (self.bottom - self.top) // self.row_h)

    @property
    def max_offset(self) -> int:
        return max(0, self.n - self.visible)

    def rows(self) -> list[tuple[int, int]]:
        """(row index, top pixel) of each visible row."""
        lo = self.offset
        hi = min(self.n, lo + self.visible)
        return [(i, self.top + (i - lo) * self.row_h) for i in range(lo, hi)]

    def is_visible(self, i: int) -> bool:
        return self.offset <= i < min(self.n, self.offset + self.visible)

    def scroll(self, direction: str) -> bool:
        step = max(1, self.visible - 2)
        if direction == "up":
            new = min(self.max_offset, self.offset + step)
        elif direction == "down":
            new = max(0, self.offset - step)
        else:
            return False
        changed = new != self.offset
        self.offset = new
        return changed
