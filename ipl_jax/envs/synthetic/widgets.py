"""Screen building blocks: ``Widget`` (what is drawn, what tapping it does), per-episode ``Geometry``, cached font
metrics. Boxes are integer pixels ``(x1, y1, x2, y2)``, x2/y2 exclusive (exact through AITZ's pixel boxes).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from PIL import ImageFont

from ipl_jax.envs.synthetic.config import Variant

Box = tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True)
class Widget:
    """One drawn thing. ``kind``: its AITZ ui_type (empty: decoration only); ``effect``: what tapping it does."""

    box: Box
    style: str
    text: str = ""
    kind: str = "TEXT"
    clickable: bool = False
    on_tap: Callable[[], None] | None = dataclasses.field(default=None, compare=False, repr=False)
    effect: str = ""
    color: tuple[int, int, int] | None = None
    glyph: str = ""
    on: bool = False  # a switch's state, a field's focus
    size: int = 0  # font size; 0 = the body size
    key: str = ""  # an internal name the expert finds the widget by (e.g. "row:Wi-Fi"); not exported

    @property
    def is_element(self) -> bool:
        return bool(self.kind)

    def contains(self, x: float, y: float) -> bool:
        x1, y1, x2, y2 = self.box
        return x1 <= x < x2 and y1 <= y < y2

    def paint_item(self) -> tuple:
        """What the painter needs (picklable: no callbacks)."""
        return (self.style, self.box, self.text, self.color, self.glyph, self.on, self.size)


@functools.lru_cache(maxsize=16)
def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


@functools.lru_cache(maxsize=8192)
def text_width(text: str, size: int) -> int:
    return int(round(font(size).getlength(text)))


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Pixel metrics of one episode's screens."""

    width: int
    height: int
    status_h: int
    header_h: int
    row_h: int
    nav_h: int
    margin: int
    font_size: int
    variant: Variant
    nav_buttons: bool  # three-button navigation bar (else a gesture bar)

    @property
    def small(self) -> int:
        return max(8, self.font_size - 1)

    @property
    def title(self) -> int:
        return self.font_size + 3

    @property
    def text_h(self) -> int:
        """Height of a one-line text box (the font's line plus padding)."""
        return self.font_size + 5

    @property
    def top(self) -> int:
        """First content pixel row under the status bar and header."""
        return self.status_h + self.header_h

    @property
    def bottom(self) -> int:
        return self.height - self.nav_h

    def text_box(self, x: int, y_center: int, text: str, size: int = 0, max_width: int | None = None) -> Box:
        """A tight box around one line of text starting at x, centred on y_center."""
        size = size or self.font_size
        w = text_width(text, size) + 4
        if max_width is not None:
            w = min(w, max_width)
        h = size + 5
        y1 = y_center - h // 2
        return (x, y1, min(self.width, x + w), y1 + h)


def make_geometry(width: int, height: int, font_size: int, variant: Variant, rng, jitter: bool) -> Geometry:
    """Per-episode metrics; with ``jitter`` the header, rows, margins and navigation bar vary by episode."""
    s = height / 448.0
    if jitter:
        header = round(height * float(rng.choice([0.075, 0.085, 0.095])))
        row = round(height * float(rng.choice([0.08, 0.09, 0.1])) * variant.row_scale)
        margin = round(width / 224.0 * float(rng.choice([8, 10, 12])))
        nav_buttons = bool(rng.random() < 0.5)
    else:
        header, row, margin, nav_buttons = (
            round(height * 0.085),
            round(height * 0.09 * variant.row_scale),
            round(width / 224.0 * 10),
            False,
        )
    nav = round((26 if nav_buttons else 12) * s)
    return Geometry(
        width=width,
        height=height,
        status_h=round(16 * s),
        header_h=header,
        row_h=max(row, font_size + 10),
        nav_h=nav,
        margin=margin,
        font_size=font_size,
        variant=variant,
        nav_buttons=nav_buttons,
    )
