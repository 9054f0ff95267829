"""Config files and command-line overrides, in the ml_collections style, read into the job's typed settings.

A config file has a ``get_config(arg=None)`` returning an ``ml_collections.ConfigDict``: ``default_config()`` (every
setting's default, from the typed settings) with what the file changes. ``--config`` names it as a path
(``my_config.py[:arg]``) or as a config shipped in ``ipl_jax.configs`` (``synthetic[:quick]``). Any field can be
overridden with ``--config.a.b=value`` (or ``--config.a.b value``); the text goes straight to the typed settings,
which parse it by the field's declared type (``ipl_jax.sections``): an unknown field is a one-line
``ConfigError``, a value that does not parse a one-line ``SettingsError`` naming it.

    settings = load_settings("synthetic:quick", ["--config.sft.learning_rate=1e-4"])   # ipl_jax.settings.Settings

``parse_args_with_settings(parser, argv, default_config)`` adds ``--config`` to a command's parser, sends every
``--config.*`` argument to the overrides and returns ``(args, settings)``.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections

from ipl_jax.sections import CommandLineText
from ipl_jax.settings import Settings
from ipl_jax.settings.job import current_name

CONFIG_DIR = Path(__file__).resolve().parent  # the shipped configs live beside this loader
_OVERRIDE_PREFIX = "--config."


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the file / field."""


# ------------------------------------------------------------------------------------------------ config files


def default_config() -> ml_collections.ConfigDict:
    """Every setting's default (``ipl_jax.settings``: each field declared once, with its type and meaning) as a
    ConfigDict, which a config file changes where it differs."""
    return ml_collections.ConfigDict(Settings.defaults())


def resolve_config_path(path_or_name: str) -> tuple[Path, str | None]:
    """Split ``path[:arg]`` and find the file: as given, else a shipped config of that name."""
    spec, arg = path_or_name, None
    # A ':' after the file part separates the get_config argument (Windows drive letters are not a concern here).
    if ":" in spec:
        spec, arg = spec.split(":", 1)
    candidates = [Path(spec)]
    if "/" not in spec:
        candidates.append(CONFIG_DIR / (spec if spec.endswith(".py") else f"{spec}.py"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate, arg
    tried = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"config {path_or_name!r}: no such file (tried {tried})")


def load_config_file(path: str | os.PathLike, arg: str | None = None) -> ml_collections.ConfigDict:
    """Import a config file and call its ``get_config(arg)`` (``get_config()`` when no argument is given)."""
    path = Path(path)
    module_name = f"_ipl_jax_config_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"config file {path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    get_config = getattr(module, "get_config", None)
    if get_config is None:
        raise ConfigError(f"config file {path}: has no get_config() function")
    n_params = len(inspect.signature(get_config).parameters)
    if arg is not None and n_params == 0:
        raise ConfigError(f"config file {path}: get_config() takes no argument but {arg!r} was given")
    try:
        config = get_config(arg) if n_params else get_config()
    except ValueError as e:  # e.g. an unknown variant: the config file names what it accepts
        where = f"config {path.name}{':' + arg if arg is not None else ''}"
        raise ConfigError(str(e) if path.name in str(e) else f"{where}: {e}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path}: get_config returned {type(config).__name__}, expected a ConfigDict")
    return config


def load_config(path_or_name: str | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Load ``path[:arg]`` (or copy a ConfigDict), lock and return it."""
    if isinstance(path_or_name, ml_collections.ConfigDict):
        config = ml_collections.ConfigDict(path_or_name.to_dict(preserve_field_references=True))
    else:
        config = load_config_file(*resolve_config_path(path_or_name))
    config.lock()
    return config


def load_settings(path_or_name: str | ml_collections.ConfigDict, overrides: Sequence[str] = ()) -> Settings:
    """The config ``path[:arg]`` with ``--config.a.b=value`` overrides, read into the job's typed ``Settings``
    (``ConfigError`` names an unknown field, ``SettingsError`` a bad value)."""
    source = "<config>" if isinstance(path_or_name, ml_collections.ConfigDict) else str(path_or_name)
    values = load_config(path_or_name).to_dict()
    for field, text in parse_override_args(overrides):
        set_override(values, field, text, source)
    return Settings.from_dict(values)


# ------------------------------------------------------------------------------------------------- overrides


def parse_override_args(args: Sequence[str]) -> list[tuple[str, str]]:
    """``['--config.a.b=1', '--config.c', 'x', 'd.e=2']`` -> ``[('a.b', '1'), ('c', 'x'), ('d.e', '2')]``."""
    out: list[tuple[str, str]] = []
    i = 0
    args = list(args)
    while i < len(args):
        item = args[i]
        body = item
        for prefix in (_OVERRIDE_PREFIX, "config."):
            if body.startswith(prefix):
                body = body[len(prefix) :]
                break
        if "=" in body:
            field, value = body.split("=", 1)
            i += 1
        elif item.startswith(_OVERRIDE_PREFIX) and i + 1 < len(args):
            field, value = body, args[i + 1]
            i += 2
        else:
            raise ConfigError(f"override {item!r}: expected --config.FIELD=VALUE")
        if not field or any(not part for part in field.split(".")):
            raise ConfigError(f"override {item!r}: bad field name {field!r}")
        out.append((field, value))
    return out


def set_override(values: dict, field: str, text: str, source: str = "<config>") -> None:
    """Set ``values[a][b]`` of the dotted ``field`` (an old name: where it moved) to the command-line ``text``,
    parsed later by the field's type."""
    field = current_name(field)
    *parents, leaf = field.split(".")
    node, walked = values, []
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(_unknown_field(source, field, walked, node))
        node = node[part]
        walked.append(part)
    if not isinstance(node, dict) or leaf not in node:
        raise ConfigError(_unknown_field(source, field, walked, node))
    if isinstance(node[leaf], dict):
        raise ConfigError(f"{source}: field {field!r} is a section, not a value; set its fields one by one")
    node[leaf] = CommandLineText(text)


def _unknown_field(source: str, field: str, walked: list[str], node: Any) -> str:
    at = ".".join(walked) or "<top level>"
    if isinstance(node, dict):
        known = ", ".join(sorted(node.keys()))
        return f"{source}: unknown config field {field!r} (fields at {at}: {known})"
    return f"{source}: unknown config field {field!r} ({at} is a value, not a section)"


# ---------------------------------------------------------------------------------------------- argparse glue


def parse_args_with_settings(
    parser: argparse.ArgumentParser, argv: Sequence[str], default_config: str | None = None
) -> tuple[argparse.Namespace, Settings]:
    """Parse ``argv`` with ``parser`` plus ``--config PATH[:ARG]`` and any number of ``--config.a.b=v``, the config
    read into the job's typed ``Settings``. Arguments the parser does not know are an error (``parser.error``)."""
    parser.add_argument("--config", default=None, help="config file PATH[:ARG] or a name under configs/")
    config_args: list[str] = []
    rest: list[str] = []
    argv = list(argv)
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith(_OVERRIDE_PREFIX):
            config_args.append(item)
            if "=" not in item and i + 1 < len(argv):
                config_args.append(argv[i + 1])
                i += 1
        else:
            rest.append(item)
        i += 1
    args = parser.parse_args(rest)
    source = args.config if args.config is not None else default_config
    if source is None:
        parser.error("--config is required")
    try:
        return args, load_settings(source, config_args)
    except ConfigError as e:
        parser.error(str(e))
