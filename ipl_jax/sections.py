"""A settings section's base, below every layer: ``Section`` (a frozen dataclass whose fields are declared with their
default, one-line doc and check), the one-line ``SettingsError`` and the checks sections share. A library module
that owns a section (``rl.sections``) and the job's settings (``ipl_jax.settings``) both build on it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar


class SettingsError(ValueError):
    """A job setting that cannot be used; the message is one line naming the field and what to do."""


def setting_error(field: str, value: Any, why: str) -> SettingsError:
    """``config.<field>=<value>: <why> (fix it with --config.<field>=...)``."""
    return SettingsError(f"config.{field}={value!r}: {why} (fix it with --config.{field}=...)")


def is_nonneg(v) -> bool:
    return math.isfinite(v) and v >= 0


def is_positive(v) -> bool:
    return math.isfinite(v) and v > 0


def one_of(choices) -> str:
    return f"must be one of {', '.join(choices)}"


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section: ``PATH`` is its dotted name; ``need`` raises the one-line error of a field."""

    PATH: ClassVar[str] = ""

    def need(self, name: str, ok: bool, why: str) -> None:
        if not ok:
            raise setting_error(f"{self.PATH}.{name}" if self.PATH else name, getattr(self, name), why)

    def at_least(self, names: str, low: int, note: str = "") -> None:
        for name in names.split():
            self.need(name, getattr(self, name) >= low, f"must be >= {low}{note}")
