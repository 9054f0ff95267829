"""Settings: a main list (longer than the screen) of switches, submenus with their own switches, and
information rows."""

from __future__ import annotations

from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps.base import App, ListView, header
from ipl_jax.envs.synthetic.widgets import Widget


def row_kind(name: str) -> str:
    if name in content.MAIN_TOGGLES or name in content.SUB_TOGGLES:
        return "toggle"
    if name in content.SUBMENUS:
        return "submenu"
    if name in content.INFO_ROWS:
        return "info"
    raise KeyError(name)


class SettingsApp(App):
    """Pages: ``main``, a submenu name (e.g. ``Display``) or an information row name (e.g. ``Storage``)."""

    root_page = "main"

    def reset(self, rng, config, geo, required=()):
        """``required``: main-list rows that must be present (a task's switch or its submenu)."""
        super().reset(rng, config, geo)
        pool = list(content.MAIN_TOGGLES) + list(content.SUBMENUS) + list(content.INFO_ROWS)
        n = int(rng.integers(config.settings_rows[0], config.settings_rows[1] + 1))
        n = max(n, len(set(required)))
        rest = [r for r in pool if r not in required]
        picked = list(dict.fromkeys(required)) + [rest[i] for i in rng.permutation(len(rest))[: n - len(set(required))]]
        if config.shuffle_layout:
            self.rows = [picked[i] for i in rng.permutation(len(picked))]
        else:
            self.rows = [r for r in pool if r in picked]
        all_toggles = content.MAIN_TOGGLES + content.SUB_TOGGLES
        self.values = {t: bool(v) for t, v in zip(all_toggles, rng.random(len(all_toggles)) < 0.5)}
        # main-list rows carry a subtitle, so they are taller than a submenu's rows
        self.list = ListView(len(self.rows), geo.top, geo.bottom, int(geo.row_h * 1.4))
        if rng.random() < 0.5:  # the list is where an earlier visit left it
            self.list.offset = int(rng.integers(self.list.max_offset + 1))

    def open(self):
        """A launch shows the main list, scrolled where it was left."""
        self.page = self.root_page

    def back(self) -> bool:
        if self.page != "main":
            self.page = "main"
            return True
        return False

    def scroll(self, direction: str) -> bool:
        if self.page == "main":
            return self.list.scroll(direction)
        return False

    def toggle(self, name: str) -> None:
        self.values[name] = not self.values[name]

    def row_index(self, name: str) -> int:
        return self.rows.index(name)

    def _switch_effect(self, name: str) -> str:
        return f"turns {name} {'off' if self.values[name] else 'on'}"

    def _subtitle(self, name: str) -> str:
        kind = row_kind(name)
        if kind == "toggle":
            return "On" if self.values[name] else "Off"
        if kind == "submenu":
            return ", ".join(content.SUBMENUS[name][:2])
        return content.INFO_ROWS[name][0]

    def _row(self, name: str, y: int, row_h: int, subtitle: bool) -> list[Widget]:
        """One row: label (+ subtitle), and a switch or a chevron."""
        g = self.geo
        cy = y + row_h // 2
        kind = row_kind(name)
        out = []
        sw_h = g.font_size + 4
        sw_w = int(sw_h * 1.8)
        label_x = g.margin
        if kind == "toggle":
            sx = g.margin if g.variant.toggle_left else g.width - g.margin - sw_w
            if g.variant.toggle_left:
                label_x = g.margin + sw_w + 8
            effect = self._switch_effect(name)
            tap = lambda n=name: self.toggle(n)
            out.append(
                Widget(
                    (sx, cy - sw_h // 2, sx + sw_w, cy - sw_h // 2 + sw_h),
                    "switch",
                    kind="ICON_TOGGLE",
                    clickable=True,
                    on_tap=tap,
                    effect=effect,
                    on=self.values[name],
                    key=f"switch:{name}",
                )
            )
        elif kind == "submenu":
            effect, tap = f"opens the {name} settings", (lambda n=name: self._go(n))
            out.append(Widget((g.width - g.margin - 12, cy - 8, g.width - g.margin, cy + 8), "chevron", kind=""))
        else:
            effect, tap = f"opens the {name} page", (lambda n=name: self._go(n))
        label_w = g.width - label_x - g.margin - (sw_w + 8 if kind == "toggle" and not g.variant.toggle_left else 16)
        label_cy = cy - (g.text_h // 2 if subtitle else 0)
        out.insert(
            0,
            Widget(
                g.text_box(label_x, label_cy, name, max_width=label_w),
                "label",
                name,
                clickable=True,
                on_tap=tap,
                effect=effect,
                key=f"row:{name}",
            ),
        )
        if subtitle:
            sub = self._subtitle(name)
            out.insert(
                1,
                Widget(
                    g.text_box(label_x, label_cy + g.text_h, sub, g.small, max_width=label_w),
                    "subtle",
                    sub,
                    size=g.small,
                ),
            )
        out.append(Widget((g.margin, y + row_h - 1, g.width - g.margin, y + row_h), "divider", kind=""))
        return out

    def _go(self, page: str) -> None:
        self.page = page

    def widgets(self) -> list[Widget]:
        g = self.geo
        if self.page == "main":
            out = header(g, "Settings", self.host, back=False)
            for i, y in self.list.rows():
                out += self._row(self.rows[i], y, self.list.row_h, subtitle=True)
            return out
        out = header(g, self.page, self.host, back=True)
        if self.page in content.SUBMENUS:
            for k, name in enumerate(content.SUBMENUS[self.page]):
                out += self._row(name, g.top + k * g.row_h, g.row_h, subtitle=False)
        else:
            for k, line in enumerate(content.INFO_ROWS[self.page]):
                out.append(Widget(g.text_box(g.margin, g.top + k * g.row_h + g.row_h // 2, line), "text", line))
        return out

    def state(self) -> dict:
        return {"page": self.page, "offset": self.list.offset, "rows": list(self.rows), "values": dict(self.values)}
