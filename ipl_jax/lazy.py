"""Lazy package names: a package lists which of its modules defines each public name, and a module is imported
only when one of its names is first read, so that importing a package's light parts stays cheap."""

import importlib
from collections.abc import Callable


def lazy_names(package: str, names_by_module: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable]:
    """(``__all__``, the module-level ``__getattr__``) of ``package``; names_by_module: module -> the public names
    it defines."""
    module_of = {name: module for module, names in names_by_module.items() for name in names}

    def __getattr__(name: str):
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)

    return list(module_of), __getattr__
