"""The synthetic GUI world: a deterministic phone simulator, tasks with a scripted expert, CoaT annotations,
and the project's default dataset written in the AITZ format (``ipl-jax synth``)."""

from ipl_jax.data.synthetic.config import WorldConfig, apply_overrides
from ipl_jax.data.synthetic.dataset import DEFAULT_SIZES, SPLITS, generate_episode, generate_split, replay, split_config
from ipl_jax.data.synthetic.tasks import Task, is_done, sample_task
from ipl_jax.data.synthetic.world import Screen, World

__all__ = [
    "WorldConfig",
    "apply_overrides",
    "DEFAULT_SIZES",
    "SPLITS",
    "generate_episode",
    "generate_split",
    "replay",
    "split_config",
    "Task",
    "is_done",
    "sample_task",
    "Screen",
    "World",
]
