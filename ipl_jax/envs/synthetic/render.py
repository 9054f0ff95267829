"""Drawing screens with PIL from picklable paint tuples (``Widget.paint_item``), so a ``ScreenPainter`` can render
lazily in a loader worker; text is stamped from cached glyph masks.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math

from PIL import Image, ImageDraw

from ipl_jax.envs.synthetic.config import THEMES
from ipl_jax.envs.synthetic.widgets import font, text_width


@functools.lru_cache(maxsize=8192)
def _text_mask(text: str, size: int) -> Image.Image:
    """An L-mode mask of one line of text: width = text width + 4, height = size + 5, text vertically centred."""
    w, h = text_width(text, size) + 4, size + 5
    m = Image.new("L", (max(1, w), h), 0)
    ImageDraw.Draw(m).text((2, h / 2), text, font=font(size), fill=255, anchor="lm")
    return m


def _mix(a, b, t: float):
    return tuple(int(round(x * (1 - t) + y * t)) for x, y in zip(a, b))


class _Painter:
    def __init__(self, img: Image.Image, theme: dict, base_size: int):
        self.img, self.d, self.t, self.base = img, ImageDraw.Draw(img), theme, base_size

    def text(self, x: int, y: int, text: str, size: int, fill, max_w: int | None = None):
        if not text:
            return
        m = _text_mask(text, size)
        if max_w is not None and m.width > max_w:
            m = m.crop((0, 0, max(1, max_w), m.height))
        self.d.bitmap((x, y), m, fill=fill)

    def text_in(self, box, text: str, size: int, fill):
        """Text centred in a box."""
        x1, y1, x2, y2 = box
        w, h = text_width(text, size) + 4, size + 5
        self.text(x1 + max(0, (x2 - x1 - w) // 2), y1 + (y2 - y1 - h) // 2, text, size, fill, max_w=x2 - x1)

    def glyph(self, box, glyph: str, fill):
        """A small white pictogram inside an icon tile."""
        d = self.d
        x1, y1, x2, y2 = box
        cx, cy, r = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2
        k = r * 0.55
        if glyph == "gear":
            d.ellipse((cx - k, cy - k, cx + k, cy + k), outline=fill, width=max(2, int(r * 0.22)))
            for a in range(0, 360, 60):
                ax, ay = cx + math.cos(math.radians(a)) * k * 1.25, cy + math.sin(math.radians(a)) * k * 1.25
                d.rectangle((ax - 1.5, ay - 1.5, ax + 1.5, ay + 1.5), fill=fill)
        elif glyph == "bag":
            d.rectangle((cx - k, cy - k * 0.4, cx + k, cy + k), fill=fill)
            d.arc((cx - k * 0.5, cy - k * 1.1, cx + k * 0.5, cy + k * 0.1), 180, 360, fill=fill, width=2)
        elif glyph == "tri":
            d.polygon([(cx - k * 0.7, cy - k), (cx - k * 0.7, cy + k), (cx + k, cy)], fill=fill)
        elif glyph == "bubble":
            d.ellipse((cx - k, cy - k * 0.8, cx + k, cy + k * 0.6), fill=fill)
            d.polygon([(cx - k * 0.6, cy + k * 0.2), (cx - k * 0.9, cy + k), (cx - k * 0.1, cy + k * 0.5)], fill=fill)
        elif glyph == "dot":
            d.rounded_rectangle((cx - k, cy - k * 0.7, cx + k, cy + k * 0.8), radius=2, fill=fill)
            d.ellipse((cx - k * 0.4, cy - k * 0.35, cx + k * 0.4, cy + k * 0.45), fill=(60, 60, 60))
        elif glyph == "clock":
            d.ellipse((cx - k, cy - k, cx + k, cy + k), outline=fill, width=2)
            d.line((cx, cy, cx, cy - k * 0.7), fill=fill, width=2)
            d.line((cx, cy, cx + k * 0.5, cy), fill=fill, width=2)
        elif glyph == "pin":
            d.ellipse((cx - k * 0.7, cy - k, cx + k * 0.7, cy + k * 0.4), fill=fill)
            d.polygon([(cx - k * 0.5, cy), (cx + k * 0.5, cy), (cx, cy + k)], fill=fill)
        elif glyph == "note":
            d.ellipse((cx - k * 0.8, cy + k * 0.2, cx, cy + k), fill=fill)
            d.line((cx - 1, cy + k * 0.6, cx - 1, cy - k), fill=fill, width=2)
            d.line((cx - 1, cy - k, cx + k * 0.7, cy - k * 0.6), fill=fill, width=2)
        elif glyph == "sun":
            d.ellipse((cx - k * 0.55, cy - k * 0.55, cx + k * 0.55, cy + k * 0.55), fill=fill)
            for a in range(0, 360, 45):
                c, s = math.cos(math.radians(a)), math.sin(math.radians(a))
                d.line((cx + c * k * 0.75, cy + s * k * 0.75, cx + c * k, cy + s * k), fill=fill, width=1)
        elif glyph == "env":
            d.rectangle((cx - k, cy - k * 0.65, cx + k, cy + k * 0.65), outline=fill, width=2)
            d.line((cx - k, cy - k * 0.65, cx, cy + k * 0.1, cx + k, cy - k * 0.65), fill=fill, width=2)
        elif glyph == "mic":
            d.rounded_rectangle((cx - k * 0.35, cy - k, cx + k * 0.35, cy + k * 0.3), radius=3, fill=fill)
            d.line((cx, cy + k * 0.3, cx, cy + k), fill=fill, width=2)
        elif glyph == "run":
            d.ellipse((cx - 2, cy - k, cx + 2, cy - k + 4), fill=fill)
            d.line((cx, cy - k + 4, cx - k * 0.2, cy + k * 0.2, cx - k * 0.7, cy + k), fill=fill, width=2)
            d.line((cx - k * 0.2, cy + k * 0.2, cx + k * 0.6, cy + k), fill=fill, width=2)
        elif glyph == "rec":
            d.ellipse((cx - k * 0.6, cy - k * 0.6, cx + k * 0.6, cy + k * 0.6), fill=fill)
        else:
            size = max(8, int(r * (1.1 if len(glyph) == 1 else 0.85)))
            self.text_in(box, glyph, size, fill)

    def paint(self, item):
        """Draw one paint item ``(style, box, text, color, glyph, on, size)``; size None means the base size."""
        style, box, text, color, glyph, on, size = item
        family = self._FAMILIES.get(style)
        if family is None:
            raise ValueError(f"render: unknown widget style {style!r}")
        family(self, style, box, text, color, glyph, on, size or self.base)

    def _paint_text(self, style, box, text, color, glyph, on, size):
        """Plain text styles: text / label, subtle, title; clipped to the box width."""
        x1, y1, x2, _ = box
        fill = {"subtle": self.t["subtle"], "title": self.t["header_text"]}.get(style, self.t["text"])
        self.text(x1, y1, text, size, fill, max_w=x2 - x1)

    def _paint_chrome(self, style, box, text, color, glyph, on, size):
        """Screen chrome: header background, wallpaper, back arrow, status icons, divider, nav bar, page dots."""
        t, d = self.t, self.d
        x1, y1, x2, y2 = box
        if style == "header_bg":
            d.rectangle((x1, y1, x2 - 1, y2 - 1), fill=t["header"])
            d.line((x1, y2 - 1, x2, y2 - 1), fill=t["divider"])
        elif style == "wallpaper":
            d.rectangle((x1, y1, x2 - 1, y2 - 1), fill=_mix(t["bg"], t["accent"], 0.18))
        elif style == "back":
            cx, cy, k = (x1 + x2) / 2, (y1 + y2) / 2, (y2 - y1) * 0.28
            d.line((cx + k * 0.5, cy - k, cx - k * 0.5, cy, cx + k * 0.5, cy + k), fill=t["header_text"], width=2)
        elif style == "status_icons":
            c = t["text"]
            d.rectangle((x2 - 16, y1 + 4, x2 - 4, y2 - 4), outline=c)
            d.rectangle((x2 - 14, y1 + 6, x2 - 7, y2 - 6), fill=c)
            for i in range(4):
                d.rectangle((x2 - 36 + i * 4, y2 - 5 - i * 2, x2 - 34 + i * 4, y2 - 4), fill=c)
            if on:  # Wi-Fi on: a small fan
                d.pieslice((x2 - 58, y1 + 3, x2 - 44, y2 + 3), 225, 315, fill=c)
        elif style == "divider":
            d.line((x1, y1, x2, y1), fill=t["divider"])
        elif style == "navbar":
            c = t["subtle"]
            cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
            if on:  # three buttons
                k = max(3, (y2 - y1) // 4)
                d.polygon([(cx - 50 + k, cy - k), (cx - 50 + k, cy + k), (cx - 50 - k, cy)], outline=c)
                d.ellipse((cx - k, cy - k, cx + k, cy + k), outline=c)
                d.rectangle((cx + 50 - k, cy - k, cx + 50 + k, cy + k), outline=c)
            else:
                d.rounded_rectangle((cx - 30, cy - 1, cx + 30, cy + 1), radius=1, fill=c)
        elif style == "dots":
            cur, n = (int(v) for v in glyph.split("/"))
            cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
            for i in range(n):
                px = cx + (i - (n - 1) / 2) * 10
                d.ellipse((px - 2.5, cy - 2.5, px + 2.5, cy + 2.5), fill=t["text"] if i == cur else t["toggle_off"])

    def _paint_control(self, style, box, text, color, glyph, on, size):
        """Controls: switch, chevron, text field (with caret when focused), buttons, chip."""
        t, d = self.t, self.d
        x1, y1, x2, y2 = box
        if style == "switch":
            h = y2 - y1
            d.rounded_rectangle(box, radius=h // 2, fill=t["accent"] if on else t["toggle_off"])
            kx = x2 - h + 1 if on else x1 + 1
            d.ellipse((kx, y1 + 1, kx + h - 3, y2 - 2), fill=(255, 255, 255))
        elif style == "chevron":
            cx, cy, k = (x1 + x2) / 2, (y1 + y2) / 2, (y2 - y1) * 0.3
            d.line((cx - k * 0.5, cy - k, cx + k * 0.5, cy, cx - k * 0.5, cy + k), fill=t["subtle"], width=2)
        elif style == "field":
            d.rounded_rectangle(
                box,
                radius=(y2 - y1) // 2,
                fill=t["bg"],
                outline=t["accent"] if on else t["divider"],
                width=2 if on else 1,
            )
            fill = t["text"] if glyph == "filled" else t["subtle"]
            self.text(x1 + 6, y1 + (y2 - y1 - size - 5) // 2, text, size, fill, max_w=x2 - x1 - 10)
            if on:
                cx = min(x2 - 6, x1 + 6 + (text_width(text, size) + 4 if glyph == "filled" else 2))
                d.line((cx, y1 + 4, cx, y2 - 5), fill=t["accent"], width=1)
        elif style == "button":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, fill=t["accent"])
            self.text_in(box, text, size, t["on_accent"])
        elif style == "button2":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, outline=t["accent"], width=1)
            self.text_in(box, text, size, t["accent"])
        elif style == "chip":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, fill=t["surface"])
            self.text_in(box, text, size, t["text"])

    def _paint_content(self, style, box, text, color, glyph, on, size):
        """Content: app icon, card, banner, picture, chat bubbles, avatar, toast."""
        t, d = self.t, self.d
        x1, y1, x2, y2 = box
        if style == "app_icon":
            tile = y2 - y1 - size - 5
            tx = x1 + (x2 - x1 - tile) // 2
            tbox = (tx, y1, tx + tile, y1 + tile)
            d.rounded_rectangle(tbox, radius=max(3, tile // 4), fill=color)
            self.glyph(tbox, glyph, (255, 255, 255))
            self.text_in((x1, y1 + tile, x2, y2), text, size, t["text"])
        elif style == "card":
            d.rounded_rectangle(box, radius=4, fill=t["surface"])
        elif style == "banner":
            d.rounded_rectangle(box, radius=4, fill=_mix(t["surface"], t["accent"], 0.35))
            self.text(x1 + 4, y1 + (y2 - y1 - size - 5) // 2, text, size, t["text"], max_w=x2 - x1 - 6)
        elif style == "picture":
            d.rounded_rectangle(box, radius=4, fill=color or t["surface"])
            k = min(x2 - x1, y2 - y1) // 3
            cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
            self.glyph((cx - k, cy - k, cx + k, cy + k), glyph, (255, 255, 255))
        elif style in ("bubble_in", "bubble_out"):
            fill = t["surface"] if style == "bubble_in" else t["accent"]
            ink = t["text"] if style == "bubble_in" else t["on_accent"]
            d.rounded_rectangle(box, radius=6, fill=fill)
            self.text(x1 + 3, y1 + (y2 - y1 - size - 5) // 2, text, size, ink, max_w=x2 - x1 - 4)
        elif style == "avatar":
            d.ellipse((x1, y1, x2 - 1, y2 - 1), fill=color)
            self.text_in(box, glyph, size, (255, 255, 255))
        elif style == "toast":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, fill=(50, 50, 54))
            self.text_in(box, text, size, (245, 245, 245))

    _FAMILIES = {
        **dict.fromkeys(("text", "label", "subtle", "title"), _paint_text),
        **dict.fromkeys(("header_bg", "wallpaper", "back", "status_icons", "divider", "navbar", "dots"), _paint_chrome),
        **dict.fromkeys(("switch", "chevron", "field", "button", "button2", "chip"), _paint_control),
        **dict.fromkeys(
            ("app_icon", "card", "banner", "picture", "bubble_in", "bubble_out", "avatar", "toast"), _paint_content
        ),
    }


def paint(size: tuple[int, int], theme: str, items, base_size: int = 11) -> Image.Image:
    """Draw paint items on a ``size`` = (width, height) RGB canvas with the named theme."""
    img = Image.new("RGB", size, THEMES[theme]["bg"])
    p = _Painter(img, THEMES[theme], base_size)
    for item in items:
        p.paint(item)
    return img


@dataclasses.dataclass(frozen=True)
class ScreenPainter:
    """A picklable zero-argument callable rendering one screen at ``size``, resized to ``out_size`` when given."""

    size: tuple[int, int]
    theme: str
    items: tuple
    base_size: int = 11
    out_size: tuple[int, int] | None = None

    def __call__(self) -> Image.Image:
        img = paint(self.size, self.theme, self.items, self.base_size)
        if self.out_size is not None and tuple(self.out_size) != img.size:
            img = img.resize(tuple(self.out_size), Image.Resampling.BICUBIC)
        return img


def png_bytes(img: Image.Image, compress_level: int = 6) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()
