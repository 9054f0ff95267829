"""The home screen: a clock widget and pages of app icons (swipe left / right between pages)."""

from __future__ import annotations

from ipl_jax.envs.synthetic.apps.base import App
from ipl_jax.envs.synthetic.widgets import Widget


class HomeApp(App):
    root_page = "home"

    def reset(self, rng, config, geo, order=(), icons=None, clock="12:30", date="Mon 3 June"):
        super().reset(rng, config, geo)
        self.order = list(order)  # app names in grid order
        self.icons = dict(icons or {})  # name -> (colour, glyph)
        self.clock, self.date = clock, date
        self.index = 0
        v = geo.variant
        self.cols, self.rows = config.home_grid if config.home_grid[0] else (v.home_columns, v.home_rows)

    @property
    def per_page(self) -> int:
        return self.cols * self.rows

    @property
    def n_pages(self) -> int:
        return max(1, -(-len(self.order) // self.per_page))

    def open(self):
        self.index = 0

    def page_of(self, name: str) -> int:
        return self.order.index(name) // self.per_page

    def visible_apps(self) -> list[str]:
        return self.order[self.index * self.per_page : (self.index + 1) * self.per_page]

    def scroll(self, direction: str) -> bool:
        if direction == "left" and self.index + 1 < self.n_pages:
            self.index += 1
            return True
        if direction == "right" and self.index > 0:
            self.index -= 1
            return True
        return False

    def back(self) -> bool:
        if self.index:
            self.index = 0
            return True
        return True  # back on the home screen stays there

    def _grid(self):
        g = self.geo
        top = g.status_h + 2 * g.header_h
        dots_h = g.text_h
        cell_w = (g.width - 2 * g.margin) / self.cols
        cell_h = min((g.bottom - dots_h - top) / self.rows, cell_w * 1.3)
        return top, cell_w, cell_h, dots_h

    def widgets(self) -> list[Widget]:
        g = self.geo
        out = [Widget((0, g.status_h, g.width, g.height), "wallpaper", kind="")]
        top, cell_w, cell_h, dots_h = self._grid()
        if self.index == 0:
            big = g.font_size * 2 + 2
            cy = g.status_h + g.header_h - g.font_size // 2
            out.append(Widget(g.text_box(g.margin, cy, self.clock, big), "text", self.clock, size=big))
            out.append(Widget(g.text_box(g.margin, cy + big // 2 + g.font_size, self.date), "subtle", self.date))
        label_size = g.small
        tile = int(min(cell_w * 0.62, cell_h - label_size - 9))
        for k, name in enumerate(self.visible_apps()):
            r, c = divmod(k, self.cols)
            x1 = int(g.margin + c * cell_w) + 1
            x2 = int(g.margin + (c + 1) * cell_w) - 1
            y1 = int(top + r * cell_h) + 2
            colour, glyph = self.icons[name]
            out.append(
                Widget(
                    (x1, y1, x2, y1 + tile + label_size + 5),
                    "app_icon",
                    name,
                    kind="ICON_APP",
                    clickable=True,
                    on_tap=lambda n=name: self.host.launch(n),
                    effect=f"opens the {name} app",
                    color=colour,
                    glyph=glyph,
                    size=label_size,
                    key=f"app:{name}",
                )
            )
        if self.n_pages > 1:
            y = g.bottom - dots_h
            out.append(Widget((0, y, g.width, y + dots_h), "dots", kind="", glyph=f"{self.index}/{self.n_pages}"))
        return out

    def state(self) -> dict:
        return {"page": self.page, "home_page": self.index, "n_home_pages": self.n_pages}
