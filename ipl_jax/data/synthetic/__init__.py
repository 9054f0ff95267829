"""The synthetic GUI world: a deterministic phone simulator, tasks with a scripted expert, CoaT annotations,
and the default dataset in the AITZ format. Names are imported lazily, so reading ``config`` loads neither the
world nor PIL.
"""

import importlib

_MODULES = {  # name -> the module of this package that defines it
    "WorldConfig": "config",
    "apply_overrides": "config",
    "SPLITS": "config",
    "DEFAULT_SIZES": "dataset",
    "generate_episode": "dataset",
    "generate_split": "dataset",
    "replay": "dataset",
    "split_config": "dataset",
    "Task": "tasks",
    "is_done": "tasks",
    "sample_task": "tasks",
    "Screen": "world",
    "World": "world",
}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
