"""The synthetic world's difficulty knobs (``WorldConfig``), its themes and layout variants; held-out themes and
variants appear only in the ``test_app_unseen`` split.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from ipl_jax.sections import CommandLineText, SettingsError, typed

# Colour palettes. Keys: bg, surface, header, header_text, text, subtle, accent, on_accent, divider, toggle_off.
THEMES = {
    "light": dict(
        bg=(250, 250, 250),
        surface=(236, 238, 242),
        header=(255, 255, 255),
        header_text=(20, 20, 20),
        text=(25, 25, 25),
        subtle=(110, 110, 118),
        accent=(26, 115, 232),
        on_accent=(255, 255, 255),
        divider=(220, 220, 225),
        toggle_off=(170, 170, 176),
    ),
    "mint": dict(
        bg=(240, 250, 246),
        surface=(214, 238, 228),
        header=(30, 140, 110),
        header_text=(255, 255, 255),
        text=(20, 40, 34),
        subtle=(90, 120, 110),
        accent=(0, 150, 110),
        on_accent=(255, 255, 255),
        divider=(200, 226, 216),
        toggle_off=(160, 180, 174),
    ),
    "sand": dict(
        bg=(252, 247, 236),
        surface=(240, 228, 204),
        header=(200, 120, 40),
        header_text=(255, 255, 255),
        text=(50, 35, 20),
        subtle=(130, 110, 90),
        accent=(200, 100, 20),
        on_accent=(255, 255, 255),
        divider=(230, 216, 190),
        toggle_off=(190, 176, 160),
    ),
    "dark": dict(
        bg=(22, 24, 28),
        surface=(44, 47, 54),
        header=(32, 34, 40),
        header_text=(240, 240, 240),
        text=(235, 235, 235),
        subtle=(160, 160, 170),
        accent=(120, 170, 255),
        on_accent=(10, 20, 40),
        divider=(60, 63, 70),
        toggle_off=(90, 92, 100),
    ),
    # held out
    "night_blue": dict(
        bg=(14, 22, 48),
        surface=(30, 44, 84),
        header=(20, 30, 66),
        header_text=(230, 236, 255),
        text=(226, 232, 255),
        subtle=(150, 160, 200),
        accent=(255, 196, 60),
        on_accent=(30, 20, 0),
        divider=(44, 58, 100),
        toggle_off=(80, 90, 130),
    ),
    "rose": dict(
        bg=(255, 244, 246),
        surface=(248, 220, 228),
        header=(190, 40, 90),
        header_text=(255, 255, 255),
        text=(60, 20, 30),
        subtle=(140, 100, 110),
        accent=(210, 40, 100),
        on_accent=(255, 255, 255),
        divider=(240, 210, 218),
        toggle_off=(200, 170, 180),
    ),
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
