"""A distractor app: a header and a few feature rows that only show a short note when tapped."""

from __future__ import annotations

from ipl_jax.envs.synthetic import content
from ipl_jax.envs.synthetic.apps.base import App, header
from ipl_jax.envs.synthetic.widgets import Widget


class PlainApp(App):
    root_page = "main"

    def widgets(self) -> list[Widget]:
        g = self.geo
        out = header(g, self.name, self.host, back=False)
        for k, feature in enumerate(content.APP_FEATURES.get(self.name, ())):
            cy = g.top + k * g.row_h + g.row_h // 2
            out.append(
                Widget(
                    g.text_box(g.margin, cy, feature),
                    "label",
                    feature,
                    clickable=True,
                    on_tap=lambda f=feature: self.host.toast(f"{f}: nothing new"),
                    effect=f"shows {feature}",
                )
            )
            out.append(
                Widget((g.margin, cy + g.row_h // 2 - 1, g.width - g.margin, cy + g.row_h // 2), "divider", kind="")
            )
        return out
