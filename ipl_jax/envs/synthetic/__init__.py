"""The synthetic GUI world: a deterministic phone simulator, tasks with a scripted expert, CoaT annotations,
and the default dataset in the AITZ format. Names are imported lazily, so reading ``config`` loads neither the
world nor PIL.
"""

from ipl_jax.lazy import lazy_names

__all__, __getattr__ = lazy_names(
    __name__,
    {  # module of this package -> the names it defines
        "config": ("WorldConfig", "apply_overrides", "SPLITS"),
        "dataset": ("DEFAULT_SIZES", "generate_episode", "generate_split", "replay", "split_config"),
        "tasks": ("Task", "is_done", "sample_task"),
        "world": ("Screen", "World"),
    },
)
