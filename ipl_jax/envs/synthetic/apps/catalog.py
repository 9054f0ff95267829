"""Shop and Store: a search box, a result list, and a details page with a main button. Results depend only on
the query and the episode's salt.
"""

from __future__ import annotations

import zlib

import numpy as np

from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps.base import App, ListView, clean_typed, header
from ipl_jax.envs.synthetic.widgets import Widget

PRODUCT_RGB = {
    "Red": (210, 50, 50),
    "Blue": (50, 90, 210),
    "Black": (40, 40, 40),
    "White": (200, 200, 205),
    "Green": (40, 160, 80),
}
ITEM_GLYPH = {
    "Shoes": "S",
    "Hat": "H",
    "Jacket": "J",
    "Bag": "bag",
    "Watch": "clock",
    "Lamp": "sun",
    "Mug": "M",
    "Socks": "So",
}


def normalize_query(text: str) -> str:
    return " ".join(str(text).lower().split())


def _stable(*parts) -> int:
    return zlib.crc32("|".join(str(p) for p in parts).encode())


class CatalogApp(App):
    """Pages: ``main`` (search box, chips, recommended), ``results``, ``details``."""

    root_page = "main"

    def __init__(self, name, host, store: bool):
        super().__init__(name, host)
        self.store = store
        self.placeholder = "Search apps" if store else "Search products"

    def reset(self, rng, config, geo):
        super().reset(rng, config, geo)
        self.salt = int(rng.integers(1 << 30))
        self.n_results = config.n_results
        self.shuffle = config.shuffle_layout
        lo, hi = config.n_distractors
        chips = content.STORE_CHIPS if self.store else content.SHOP_CHIPS
        self.chips = [chips[i] for i in sorted(rng.permutation(len(chips))[: int(rng.integers(lo, hi + 1))])]
        n_rec = int(rng.integers(lo, hi + 1))
        self.recommended = [self._random_item(rng) for _ in range(n_rec)]
        self.banner_p = 0.5 if hi > 0 else 0.0
        self.cart: list[str] = []
        self.installed: set[str] = set()
        self.open()

    def open(self):
        self.page = "main"
        self.field, self.focused = "", False
        self.query, self.results, self.banner, self.item, self.came_from = None, [], None, None, "main"
        self.list = None

    # ---------------------------------------------------------------------------------------- content

    def _random_item(self, rng) -> str:
        if self.store:
            return content.STORE_APPS[int(rng.integers(len(content.STORE_APPS)))]
        return " ".join(
            (
                content.COLOURS[int(rng.integers(len(content.COLOURS)))],
                content.ITEMS[int(rng.integers(len(content.ITEMS)))],
                content.PRODUCT_MODELS[int(rng.integers(len(content.PRODUCT_MODELS)))],
            )
        )

    def results_for(self, query: str) -> tuple[list[str], str | None]:
        """(result names in display order, sponsored item or None) for a normalised query."""
        rng = np.random.default_rng([self.salt, _stable(query)])
        n = int(rng.integers(self.n_results[0], self.n_results[1] + 1))
        words = query.split()
        if self.store:
            hits = [a for a in content.STORE_APPS if query and query in a.lower()]
            others = [a for a in content.STORE_APPS if a not in hits]
            others = [others[i] for i in rng.permutation(len(others))]
            names = (hits + others)[: max(n, len(hits))]
            names = [names[i] for i in rng.permutation(len(names))] if self.shuffle else sorted(names)
        else:
            colour = next((c for c in content.COLOURS if c.lower() in words), None)
            item = next((i for i in content.ITEMS if i.lower() in words), None)
            models = [content.PRODUCT_MODELS[i] for i in rng.permutation(len(content.PRODUCT_MODELS))]
            if colour and item:
                k = max(1, min(len(models), n - int(rng.integers(0, 3))))
                full = [f"{colour} {item} {m}" for m in models[:k]]
                partial = []
                for j in range(n - k):
                    if rng.random() < 0.5:
                        c = [c for c in content.COLOURS if c != colour][int(rng.integers(len(content.COLOURS) - 1))]
                        partial.append(f"{c} {item} {models[j % len(models)]}")
                    else:
                        it = [i for i in content.ITEMS if i != item][int(rng.integers(len(content.ITEMS) - 1))]
                        partial.append(f"{colour} {it} {models[j % len(models)]}")
                rest = full[1:] + [p for p in dict.fromkeys(partial) if p not in full]
                if self.shuffle:
                    rest = [rest[i] for i in rng.permutation(len(rest))]
                names = full[:1] + rest
            elif colour or item:
                names = []
                for m in models[:n]:
                    other = content.ITEMS if colour else content.COLOURS
                    o = other[int(rng.integers(len(other)))]
                    names.append(f"{colour} {o} {m}" if colour else f"{o} {item} {m}")
                names = list(dict.fromkeys(names))
            else:
                names = []
        banner = None
        if names and rng.random() < self.banner_p:
            pool = [x for x in (self._random_item(rng) for _ in range(4)) if x not in names]
            banner = pool[0] if pool else None
        return names, banner

    def first_result(self, query: str) -> str | None:
        names, _ = self.results_for(normalize_query(query))
        return names[0] if names else None

    def price(self, item: str) -> str:
        return f"${5 + _stable(self.salt, item) % 95}.99" if not self.store else "Free"

    # ---------------------------------------------------------------------------------------- events

    def focus(self):
        self.focused = True

    def type_text(self, text: str) -> bool:
        if not self.focused or self.page == "details":
            return False
        self.field = (self.field + clean_typed(text))[:60]
        return True

    def enter(self) -> bool:
        if not self.focused or self.page == "details" or not self.field.strip():
            return False
        self.query = normalize_query(self.field)
        self.results, self.banner = self.results_for(self.query)
        self.page, self.focused = "results", False
        self.list = None  # laid out on the next draw
        return True

    def show(self, item: str):
        self.came_from = self.page
        self.item = item
        self.page = "details"

    def primary(self):
        if self.store:
            if self.item in self.installed:
                self.host.toast(f"Opening {self.item}")
            else:
                self.installed.add(self.item)
                self.host.toast(f"{self.item} installed")
        else:
            self.cart.append(self.item)
            self.host.toast("Added to cart")

    def back(self) -> bool:
        if self.focused:
            self.focused = False
            return True
        if self.page == "details":
            self.page = self.came_from if self.came_from in ("main", "results") else "main"
            return True
        if self.page == "results":
            self.page = "main"
            return True
        return False

    def scroll(self, direction: str) -> bool:
        if self.page == "results" and self.list is not None:
            return self.list.scroll(direction)
        return False

    # ---------------------------------------------------------------------------------------- layout

    def _field(self, y: int) -> Widget:
        g = self.geo
        h = g.text_h + 8
        filled = bool(self.field)
        text = self.field if filled else self.placeholder
        effect = "keeps the cursor in the search box" if self.focused else "puts the cursor in the search box"
        return Widget(
            (g.margin, y, g.width - g.margin, y + h),
            "field",
            text,
            clickable=True,
            on_tap=self.focus,
            effect=effect,
            glyph="filled" if filled else "",
            on=self.focused,
            key="field",
        )

    def _main(self) -> list[Widget]:
        g = self.geo
        out = header(g, self.name, self.host, back=False)
        if not self.store:
            label = f"Cart {len(self.cart)}"
            cy = g.status_h + g.header_h // 2
            w = g.text_box(0, cy, label)[2]
            out.append(
                Widget(
                    g.text_box(g.width - g.margin - w, cy, label),
                    "title",
                    label,
                    clickable=True,
                    on_tap=lambda: self.host.toast(f"{len(self.cart)} items in cart"),
                    effect="shows how many items are in the cart",
                )
            )
        y = g.top + g.margin
        field = self._field(y)
        out.append(field)
        y = field.box[3] + g.margin
        x = g.margin
        for chip in self.chips:
            w = g.text_box(0, 0, chip)[2] + 8
            if x + w > g.width - g.margin:
                break
            out.append(
                Widget(
                    (x, y, x + w, y + g.text_h + 4),
                    "chip",
                    chip,
                    clickable=True,
                    on_tap=lambda c=chip: self.host.toast(f"No {c.lower()} offers today"),
                    effect=f"shows {chip.lower()} offers",
                )
            )
            x += w + 6
        if self.chips:
            y += g.text_h + 4 + g.margin
        if self.recommended:
            out.append(Widget(g.text_box(g.margin, y + g.text_h // 2, "Recommended"), "subtle", "Recommended"))
            y += g.text_h + 4
            for item in self.recommended:
                if y + g.row_h > g.bottom:
                    break
                out += self._item_row(item, y, g.row_h, key=f"rec:{item}")
                y += g.row_h
        return out

    def _item_row(self, item: str, y: int, h: int, key: str) -> list[Widget]:
        g = self.geo
        pic = h - 6
        out = [Widget((g.margin, y + 3, g.margin + pic, y + 3 + pic), "picture", kind="", **self._pic(item))]
        x = g.margin + pic + 6
        cy = y + h // 2
        price = self.price(item)
        pw = g.text_box(0, 0, price, g.small)[2]
        out.append(
            Widget(
                g.text_box(x, cy, item, max_width=g.width - g.margin - pw - 4 - x),
                "label",
                item,
                clickable=True,
                on_tap=lambda i=item: self.show(i),
                effect=f"opens the page of {item}",
                key=key,
            )
        )
        out.append(Widget(g.text_box(g.width - g.margin - pw, cy, price, g.small), "subtle", price, size=g.small))
        return out

    def _item_card(self, item: str, x1: int, x2: int, y: int, h: int) -> list[Widget]:
        g = self.geo
        pic_h = h - g.text_h - 6
        out = [Widget((x1, y + 2, x2, y + 2 + pic_h), "picture", kind="", **self._pic(item))]
        out.append(
            Widget(
                g.text_box(x1, y + 2 + pic_h + g.text_h // 2 + 1, item, g.small, max_width=x2 - x1),
                "label",
                item,
                clickable=True,
                on_tap=lambda i=item: self.show(i),
                effect=f"opens the page of {item}",
                size=g.small,
                key=f"result:{item}",
            )
        )
        return out

    def _pic(self, item: str) -> dict:
        if self.store:
            return dict(
                color=((_stable(item) % 200) + 30, (_stable(item, 1) % 160) + 40, (_stable(item, 2) % 200) + 30),
                glyph=item[0],
            )
        colour, kind = item.split()[:2]
        return dict(color=PRODUCT_RGB.get(colour, (120, 120, 120)), glyph=ITEM_GLYPH.get(kind, kind[0]))

    def _results(self) -> list[Widget]:
        g = self.geo
        out = header(g, "Results", self.host, back=True)
        y = g.top + g.margin // 2
        field = self._field(y)
        out.append(field)
        y = field.box[3] + 2
        count = f"{len(self.results)} results" if self.results else "No results"
        out.append(Widget(g.text_box(g.margin, y + g.text_h // 2, count, g.small), "subtle", count, size=g.small))
        y += g.text_h
        if self.banner:
            h = g.text_h + 8
            label = f"Sponsored: {self.banner}"
            out.append(
                Widget(
                    (g.margin, y, g.width - g.margin, y + h),
                    "banner",
                    label,
                    clickable=True,
                    on_tap=lambda i=self.banner: self.show(i),
                    effect=f"opens the page of {self.banner}",
                    key="banner",
                )
            )
            y += h + 4
        grid = g.variant.results_grid
        row_h = int(g.row_h * 2.2) if grid else g.row_h
        n_rows = -(-len(self.results) // 2) if grid else len(self.results)
        if self.list is None or self.list.top != y or self.list.row_h != row_h:
            self.list = ListView(n_rows, y, g.bottom, row_h)
        for r, ry in self.list.rows():
            if grid:
                half = (g.width - 2 * g.margin - 8) // 2
                for c in range(2):
                    k = 2 * r + c
                    if k < len(self.results):
                        x1 = g.margin + c * (half + 8)
                        out += self._item_card(self.results[k], x1, x1 + half, ry, row_h)
            else:
                out += self._item_row(self.results[r], ry, row_h, key=f"result:{self.results[r]}")
        return out

    def _details(self) -> list[Widget]:
        g = self.geo
        item = self.item
        out = header(g, "App" if self.store else "Product", self.host, back=True)
        y = g.top + g.margin
        pic_h = int(g.height * 0.18)
        out.append(Widget((g.margin, y, g.width - g.margin, y + pic_h), "picture", kind="", **self._pic(item)))
        y += pic_h + g.margin // 2
        lines = [item, self.price(item), f"{3 + _stable(item, self.salt) % 20 / 10:.1f} stars"]
        if self.store:
            lines.append("by " + content.STORE_DEVELOPERS[_stable(item) % len(content.STORE_DEVELOPERS)])
        extras = (
            ["No ads", "Works offline", "Editors' choice"]
            if self.store
            else ["Fast delivery", "Free returns", "In stock"]
        )
        lines += extras[: _stable(self.salt, item, "d") % 3]
        for k, line in enumerate(lines):
            size = g.title if k == 0 else g.font_size
            out.append(
                Widget(
                    g.text_box(g.margin, y + (size + 5) // 2, line, size),
                    "text" if k == 0 else "subtle",
                    line,
                    size=size,
                )
            )
            y += size + 7
        y += g.margin // 2
        h = max(g.text_h + 8, int(g.row_h * 0.8))
        half = (g.width - 2 * g.margin - 8) // 2
        if self.store:
            main = "Open" if item in self.installed else "Install"
            effect = f"opens {item}" if item in self.installed else f"installs {item}"
            second, second_effect, second_toast = "Wishlist", "adds the app to the wishlist", "Saved to wishlist"
        else:
            main, effect = "Add to cart", f"adds {item} to the cart"
            second, second_effect, second_toast = "Buy now", "asks you to sign in", "Sign in to buy"
        out.append(
            Widget(
                (g.margin, y, g.margin + half, y + h),
                "button",
                main,
                clickable=True,
                on_tap=self.primary,
                effect=effect,
                key="primary",
            )
        )
        x2 = g.margin + half + 8
        out.append(
            Widget(
                (x2, y, x2 + half, y + h),
                "button2",
                second,
                clickable=True,
                on_tap=lambda: self.host.toast(second_toast),
                effect=second_effect,
                key="secondary",
            )
        )
        return out

    def widgets(self) -> list[Widget]:
        if self.page == "results":
            return self._results()
        if self.page == "details":
            return self._details()
        return self._main()

    def state(self) -> dict:
        return {
            "page": self.page,
            "field": self.field,
            "focused": self.focused,
            "query": self.query,
            "results": list(self.results),
            "banner": self.banner,
            "item": self.item,
            "cart": list(self.cart),
            "installed": sorted(self.installed),
        }
