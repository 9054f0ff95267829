"""The job's settings: one frozen, typed dataclass per config section, made and checked once; every failure is
one ``SettingsError`` line naming the field. Modules by concern (``data``, ``model``, ``training``, ``rounds``, ``rl``,
``evaluation``, ``job``) on the base in ``ipl_jax/sections.py``; every public name is re-exported here.

The names a library accepts are the library's own (preference.losses.LOSS_KINDS, training.optimizer.SCHEDULES,
...): a section imports them when it is made, so that importing the settings loads no JAX (commands start fast).
"""

from ipl_jax.envs.sections import EnvSettings
from ipl_jax.sections import Section, SettingsError, setting_error
from ipl_jax.settings.data import DataSettings, EvolutionSettings
from ipl_jax.settings.evaluation import AblationSettings, EvalSettings, ExportSettings
from ipl_jax.settings.job import MAX_SEED, MeshSettings, Settings
from ipl_jax.settings.model import BucketSettings, ModelSettings
from ipl_jax.settings.rl import GRPOSettings, PPOSettings, RLSettings
from ipl_jax.settings.rounds import GAMMA_MODES, GOLDEN_METHODS, METHODS, RL_METHODS, IPLSettings
from ipl_jax.settings.training import RewardSettings, SamplerSettings, SFTSettings, StartSelectionSettings

__all__ = [
    "GAMMA_MODES",
    "GOLDEN_METHODS",
    "MAX_SEED",
    "METHODS",
    "RL_METHODS",
    "AblationSettings",
    "BucketSettings",
    "DataSettings",
    "EnvSettings",
    "EvalSettings",
    "EvolutionSettings",
    "ExportSettings",
    "GRPOSettings",
    "IPLSettings",
    "MeshSettings",
    "ModelSettings",
    "PPOSettings",
    "RLSettings",
    "RewardSettings",
    "SFTSettings",
    "SamplerSettings",
    "Section",
    "StartSelectionSettings",
    "Settings",
    "SettingsError",
    "setting_error",
]
