"""Messages: a contact list (longer than the screen when there are many contacts) and a chat page with a
message box and a Send button."""

from __future__ import annotations

from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps.base import App, ListView, clean_typed, header
from ipl_jax.envs.synthetic.widgets import Widget

AVATAR_RGB = ((220, 90, 60), (60, 140, 220), (90, 170, 80), (170, 90, 190), (230, 160, 40), (40, 160, 160))


class MessagesApp(App):
    """Pages: ``contacts`` and ``chat`` (with ``self.contact``)."""

    root_page = "contacts"

    def reset(self, rng, config, geo, required=()):
        super().reset(rng, config, geo)
        n = int(rng.integers(config.n_contacts[0], config.n_contacts[1] + 1))
        n = max(n, len(set(required)))
        rest = [c for c in content.CONTACTS if c not in required]
        picked = list(dict.fromkeys(required)) + [rest[i] for i in rng.permutation(len(rest))[: n - len(set(required))]]
        if config.shuffle_layout:
            self.contacts = [picked[i] for i in rng.permutation(len(picked))]
        else:
            self.contacts = sorted(picked)
        lo, hi = config.n_distractors
        self.previews = {c: content.PREVIEWS[int(rng.integers(len(content.PREVIEWS)))] for c in self.contacts}
        self.history = {}
        for c in self.contacts:
            k = int(rng.integers(lo, hi + 2))
            self.history[c] = [
                (bool(rng.random() < 0.5), content.PREVIEWS[int(rng.integers(len(content.PREVIEWS)))]) for _ in range(k)
            ]
        self.colours = {c: AVATAR_RGB[i % len(AVATAR_RGB)] for i, c in enumerate(self.contacts)}
        self.sent: list[tuple[str, str]] = []
        self.list = ListView(len(self.contacts), geo.top, geo.bottom, int(geo.row_h * 1.2))
        if rng.random() < 0.5:  # the list is where an earlier visit left it
            self.list.offset = int(rng.integers(self.list.max_offset + 1))
        self.open()

    def open(self):
        """A launch shows the contact list, scrolled where it was left."""
        self.page, self.contact = "contacts", None
        self.field, self.focused = "", False

    def chat(self, name: str):
        self.page, self.contact = "chat", name
        self.field, self.focused = "", False

    def focus(self):
        self.focused = True

    def send(self):
        text = self.field.strip()
        if self.page != "chat" or not text:
            return
        self.sent.append((self.contact, text))
        self.history[self.contact].append((False, text))
        self.field = ""

    def type_text(self, text: str) -> bool:
        if self.page != "chat" or not self.focused:
            return False
        self.field = (self.field + clean_typed(text))[:60]
        return True

    def back(self) -> bool:
        if self.focused:
            self.focused = False
            return True
        if self.page == "chat":
            self.page, self.contact = "contacts", None
            self.field = ""
            return True
        return False

    def scroll(self, direction: str) -> bool:
        return self.page == "contacts" and self.list.scroll(direction)

    def contact_index(self, name: str) -> int:
        return self.contacts.index(name)

    def _contacts(self) -> list[Widget]:
        g = self.geo
        out = header(g, "Messages", self.host, back=False)
        rh = self.list.row_h
        for i, y in self.list.rows():
            name = self.contacts[i]
            a = min(rh - 8, 2 * g.text_h)
            out.append(
                Widget(
                    (g.margin, y + (rh - a) // 2, g.margin + a, y + (rh - a) // 2 + a),
                    "avatar",
                    kind="",
                    color=self.colours[name],
                    glyph=name[0],
                )
            )
            x = g.margin + a + 8
            out.append(
                Widget(
                    g.text_box(x, y + rh // 2 - g.text_h // 2, name),
                    "label",
                    name,
                    clickable=True,
                    on_tap=lambda n=name: self.chat(n),
                    effect=f"opens the chat with {name}",
                    key=f"contact:{name}",
                )
            )
            prev = self.previews[name]
            out.append(Widget(g.text_box(x, y + rh // 2 + g.text_h // 2, prev, g.small), "subtle", prev, size=g.small))
            out.append(Widget((x, y + rh - 1, g.width - g.margin, y + rh), "divider", kind=""))
        return out

    def _chat(self) -> list[Widget]:
        g = self.geo
        out = header(g, self.contact, self.host, back=True)
        fh = g.text_h + 8
        if g.variant.compose_on_top:
            cy = g.top + g.margin // 2
            area = (cy + fh + g.margin // 2, g.bottom - g.margin // 2)
        else:
            cy = g.bottom - g.margin // 2 - fh
            area = (g.top + g.margin // 2, cy - g.margin // 2)
        send_w = g.text_box(0, 0, "Send")[2] + 14
        filled = bool(self.field)
        out.append(
            Widget(
                (g.margin, cy, g.width - g.margin - send_w - 6, cy + fh),
                "field",
                self.field if filled else "Type a message",
                clickable=True,
                on_tap=self.focus,
                effect="puts the cursor in the message box",
                glyph="filled" if filled else "",
                on=self.focused,
                key="field",
            )
        )
        out.append(
            Widget(
                (g.width - g.margin - send_w, cy, g.width - g.margin, cy + fh),
                "button",
                "Send",
                clickable=True,
                on_tap=self.send,
                effect="sends the typed message" if filled else "does nothing while the box is empty",
                key="send",
            )
        )
        bh = g.text_h + 4
        fit = max(0, (area[1] - area[0]) // (bh + 4))
        msgs = self.history[self.contact][-fit:] if fit else []
        y = area[0]
        for incoming, text in msgs:
            w = min(g.width - 2 * g.margin - 30, g.text_box(0, 0, text)[2] + 8)
            x = g.margin if incoming else g.width - g.margin - w
            out.append(Widget((x, y, x + w, y + bh), "bubble_in" if incoming else "bubble_out", text))
            y += bh + 4
        return out

    def widgets(self) -> list[Widget]:
        return self._chat() if self.page == "chat" else self._contacts()

    def state(self) -> dict:
        return {
            "page": self.page,
            "contact": self.contact,
            "field": self.field,
            "focused": self.focused,
            "offset": self.list.offset,
            "contacts": list(self.contacts),
            "sent": [list(s) for s in self.sent],
        }
