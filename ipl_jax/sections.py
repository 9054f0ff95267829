"""A settings section's base, below every layer: ``Section`` (a frozen dataclass whose fields are declared with their
default, one-line doc and check), the one-line ``SettingsError``, the checks sections share, and the one parser of
values: a command-line ``CommandLineText`` is parsed by its field's annotated type (``typed``, ``section_from``).
A library module that owns a section (``rl.sections``), a library dataclass read from ``k=v`` text (``WorldConfig``)
and the job's settings (``ipl_jax.settings``) all build on it.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar


class SettingsError(ValueError):
    """A job setting that cannot be used; the message is one line naming the field and what to do (``why``: the
    reason alone, for a command whose flag is spelt otherwise)."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why or message


def setting_error(field: str, value: Any, why: str) -> SettingsError:
    """``config.<field>=<value>: <why> (fix it with --config.<field>=...)``."""
    return SettingsError(f"config.{field}={value!r}: {why} (fix it with --config.{field}=...)", f"{field}: {why}")


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


# ---------------------------------------------------------------------------------------------- typed values


class CommandLineText(str):
    """A ``--config.a.b=TEXT`` value: parsed by its field's type when the settings are made (``typed``)."""


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def parsed(hint, text: str, field: str):
    """A command-line ``text`` as a Python value for the field type ``hint``: true / false words, integers (``_``
    separators allowed), numbers, tuples (a Python literal, or comma-separated words: ``test,test_app_unseen``)."""
    if hint is bool:
        word = text.strip().lower()
        if word in _TRUE + _FALSE:
            return word in _TRUE
        raise setting_error(field, text, "must be true or false")
    if hint is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise setting_error(field, text, "must be an integer") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise setting_error(field, text, "must be a number") from None
    if typing.get_origin(hint) is tuple:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(part.strip() for part in text.split(",") if part.strip())
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return str(text)


def typed(hint, value, field: str):
    """``value`` as the annotated type ``hint`` (bool, int, float, str, tuples of them, dataclasses, any of these or
    None: ``none`` on the command line)."""
    args = typing.get_args(hint)
    if type(None) in args and typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, CommandLineText) and value.strip().lower() == "none"):
            return None
        (hint,) = (a for a in args if a is not type(None))
    if isinstance(value, CommandLineText) and not dataclasses.is_dataclass(hint):
        value = parsed(hint, value, field)
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return section_from(hint, value, field)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise setting_error(field, value, "must be true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise setting_error(field, value, "must be an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise setting_error(field, value, "must be a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise setting_error(field, value, "must be a string")
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (tuple, list)):
            raise setting_error(field, value, "must be a tuple")
        if args[-1] is Ellipsis:
            return tuple(typed(args[0], v, field) for v in value)
        if len(value) != len(args):
            raise setting_error(field, tuple(value), f"must be {len(args)} values")
        return tuple(typed(a, v, field) for a, v in zip(args, value))
    raise TypeError(f"{field}: no conversion for {hint}")


def section_from(cls, values, field: str):
    """A dataclass from a mapping of its fields (every field given, none unknown), each value typed."""
    where = f"config.{field}" if field else "the config"
    if not isinstance(values, Mapping):
        raise SettingsError(f"{where}: expected a section, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown, missing = sorted(set(values) - set(names)), [n for n in names if n not in values]
    if unknown:
        raise SettingsError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(names)})")
    if missing and issubclass(cls, Section):
        raise SettingsError(f"{where}: missing field(s) {', '.join(missing)}")
    prefix = f"{field}." if field else ""
    made = {n: typed(hints[n], values[n], prefix + n) for n in names if n in values}
    try:
        return cls(**made)
    except SettingsError:
        raise
    except ValueError as e:  # a library dataclass's own check (WorldConfig)
        raise SettingsError(f"{where}: {e}") from None


def defaults(cls) -> dict:
    """Every field of the dataclass ``cls`` with its default, a section's as a nested dict. No section is made, so
    no check runs and no library is imported: a config file reads them without JAX."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if isinstance(hint, type) and issubclass(hint, Section):
            out[f.name] = defaults(hint)
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()  # a library dataclass (WorldConfig): made, its own check runs
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no default")
    return out
