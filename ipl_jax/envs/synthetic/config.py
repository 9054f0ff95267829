"""The synthetic world's difficulty knobs (``WorldConfig``), its themes and layout variants; held-out themes and
variants appear only in the ``test_app_unseen`` split.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from ipl_jax.sections import CommandLineText, SettingsError, typed

# Colour palettes: a hex RGB colour for each role of PALETTE_KEYS, in that order.
PALETTE_KEYS = (
    "bg",
    "surface",
    "header",
    "header_text",
    "text",
    "subtle",
    "accent",
    "on_accent",
    "divider",
    "toggle_off",
)
_PALETTES = {
    "light": "fafafa eceef2 ffffff 141414 191919 6e6e76 1a73e8 ffffff dcdce1 aaaab0",
    "mint": "f0faf6 d6eee4 1e8c6e ffffff 142822 5a786e 00966e ffffff c8e2d8 a0b4ae",
    "sand": "fcf7ec f0e4cc c87828 ffffff 322314 826e5a c86414 ffffff e6d8be beb0a0",
    "dark": "16181c 2c2f36 202228 f0f0f0 ebebeb a0a0aa 78aaff 0a1428 3c3f46 5a5c64",
    # held out
    "night_blue": "0e1630 1e2c54 141e42 e6ecff e2e8ff 96a0c8 ffc43c 1e1400 2c3a64 505a82",
    "rose": "fff4f6 f8dce4 be285a ffffff 3c141e 8c646e d22864 ffffff f0d2da c8aab4",
}
THEMES = {
    name: {key: tuple(bytes.fromhex(c)) for key, c in zip(PALETTE_KEYS, row.split())} for name, row in _PALETTES.items()
}
SEEN_THEMES = ("light", "mint", "sand", "dark")
HELD_OUT_THEMES = ("night_blue", "rose")


@dataclasses.dataclass(frozen=True)
class Variant:
    """A layout variant: where things sit, independent of colours."""

    home_columns: int = 4
    home_rows: int = 5
    toggle_left: bool = False  # the switch sits left of its label
    results_grid: bool = False  # search results as two-column cards instead of a list
    title_centered: bool = False
    row_scale: float = 1.0
    compose_on_top: bool = False  # the message composer sits right under the header


VARIANTS = {
    "standard": Variant(),
    "compact": Variant(title_centered=True, row_scale=0.88),
    # held out
    "tiles": Variant(
        home_columns=3, home_rows=6, toggle_left=True, results_grid=True, title_centered=True, compose_on_top=True
    ),
}
SEEN_VARIANTS = ("standard", "compact")
HELD_OUT_VARIANTS = ("tiles",)

# Task families (tasks.py defines them); ``toggle_pair`` is held out for test_task_unseen.
FAMILIES = ("open_app", "toggle", "sub_toggle", "toggle_pair", "search_open", "add_to_cart", "install", "send_message")
# The dataset's splits (dataset.py): test_app_unseen plays the held-out themes and variants, test_task_unseen the
# held-out tasks.
SPLITS = ("train", "dev", "test", "test_app_unseen", "test_task_unseen")


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """Knobs of the synthetic world. Ranges ``(lo, hi)`` are inclusive and drawn per episode.

    width, height: layout pixels (boxes are fractions; ``render_size`` resizes screenshots). p_start_home,
    p_start_other_app: where episodes start (else inside the task's app). task_weights: ``family:weight`` strings.
    home_grid: (columns, rows), 0 = the variant's. The other fields size lists, distractors, jitter and theming.
    """

    width: int = 224
    height: int = 448
    render_size: tuple[int, ...] = ()
    font_size: int = 11
    n_extra_apps: tuple[int, int] = (8, 22)
    settings_rows: tuple[int, int] = (9, 18)
    n_contacts: tuple[int, int] = (6, 18)
    n_results: tuple[int, int] = (4, 9)
    n_distractors: tuple[int, int] = (0, 3)
    shuffle_layout: bool = True
    layout_jitter: bool = True
    themes: tuple[str, ...] = SEEN_THEMES
    variants: tuple[str, ...] = SEEN_VARIANTS
    randomize_icon_colors: bool = False
    home_grid: tuple[int, int] = (0, 0)
    p_start_home: float = 0.6
    p_start_other_app: float = 0.25
    task_weights: tuple[str, ...] = (
        "open_app:0.10",
        "toggle:0.20",
        "sub_toggle:0.13",
        "search_open:0.12",
        "add_to_cart:0.12",
        "install:0.13",
        "send_message:0.20",
    )

    def __post_init__(self):
        if self.width < 112 or self.height < 224:
            raise ValueError(f"WorldConfig: screen {self.width}x{self.height} is too small (min 112x224)")
        if self.render_size and (len(self.render_size) != 2 or min(self.render_size) < 28):
            raise ValueError(f"WorldConfig.render_size: need () or (width, height) >= 28 px, got {self.render_size}")
        for name in ("n_extra_apps", "settings_rows", "n_contacts", "n_results", "n_distractors"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"WorldConfig.{name}: need 0 <= lo <= hi, got {(lo, hi)}")
        for t in self.themes:
            if t not in THEMES:
                raise ValueError(f"WorldConfig.themes: unknown theme {t!r} (known: {sorted(THEMES)})")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"WorldConfig.variants: unknown variant {v!r} (known: {sorted(VARIANTS)})")
        if not self.themes or not self.variants:
            raise ValueError("WorldConfig: themes and variants must not be empty")
        if min(self.home_grid) < 0 or (0 in self.home_grid and self.home_grid != (0, 0)):
            raise ValueError(f"WorldConfig.home_grid: need (0, 0) or two positive numbers, got {self.home_grid}")
        if self.settings_rows[0] < 1 or self.n_contacts[0] < 1 or self.n_results[0] < 1:
            raise ValueError("WorldConfig: settings_rows, n_contacts and n_results need at least one row")
        if not (0 <= self.p_start_home <= 1 and 0 <= self.p_start_other_app <= 1 - self.p_start_home):
            raise ValueError("WorldConfig: p_start_home + p_start_other_app must lie in [0, 1]")
        self.family_weights()  # validates

    def family_weights(self) -> dict[str, float]:
        out = {}
        for item in self.task_weights:
            name, sep, w = item.partition(":")
            try:
                out[name] = float(w)
            except ValueError:
                raise ValueError(f"WorldConfig.task_weights: {item!r} is not 'family:weight'") from None
            if not sep or out[name] < 0:
                raise ValueError(f"WorldConfig.task_weights: {item!r} is not 'family:weight' with weight >= 0")
            if name not in FAMILIES:
                raise ValueError(f"WorldConfig.task_weights: unknown family {name!r} (known: {FAMILIES})")
        if sum(out.values()) <= 0:
            raise ValueError("WorldConfig.task_weights: all weights are zero")
        return out


def apply_overrides(config: WorldConfig, overrides: Sequence[str]) -> WorldConfig:
    """``config`` with ``k=v`` overrides applied, e.g. ``["width=252", "n_contacts=4,20", "themes=rose"]``."""
    hints = typing.get_type_hints(WorldConfig)
    changes = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in hints:
            raise ValueError(f"--world {item!r}: expected k=v with k one of {sorted(hints)}")
        try:  # the one parser of settings text, by the field's annotated type
            changes[key] = typed(hints[key], CommandLineText(value), key)
        except SettingsError as e:
            raise ValueError(f"--world {item!r}: {e.why}") from None
    return dataclasses.replace(config, **changes)
