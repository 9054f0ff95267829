"""The job's settings (``Settings``: every section, the checks across sections and the machine's) and the device
mesh (``mesh``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

from ipl_jax.coat.sections import LeafRewardShares
from ipl_jax.envs.sections import EnvSettings
from ipl_jax.envs.synthetic.config import WorldConfig
from ipl_jax.preference.sections import DPOSettings, PairSelection
from ipl_jax.sampling.sections import TreeSampling
from ipl_jax.sections import Section, SettingsError, defaults, section_from, setting_error
from ipl_jax.settings.data import DataSettings, EvolutionSettings
from ipl_jax.settings.evaluation import AblationSettings, EvalSettings, ExportSettings
from ipl_jax.settings.model import BucketSettings, ModelSettings
from ipl_jax.settings.rl import RLSettings
from ipl_jax.settings.rounds import IPLSettings
from ipl_jax.settings.training import (
    PretrainSettings,
    RewardSettings,
    SamplerSettings,
    SFTSettings,
    StartSelectionSettings,
)

MAX_SEED = 2**32 - 1  # numpy's seed range (the world and the samplers take numpy seeds)

# Fields that moved into a library's section, which the job's section now holds whole, fields renamed when the
# starting policy got its own word, and a fresh model's sizes, now fields of the model config's own TextConfig /
# VisionConfig: the old dotted name still works, with a one-line notice.
_NESTED = {
    "ipl.dpo": DPOSettings,
    "ipl.selection": PairSelection,
    "sampler.tree": TreeSampling,
    "reward.shares": LeafRewardShares,
}
_TEXT_SIZES = "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads"
MOVED = {
    **{
        f"{path.rsplit('.', 1)[0]}.{f.name}": f"{path}.{f.name}"
        for path, cls in _NESTED.items()
        for f in dataclasses.fields(cls)
    },
    "sft.seed_candidates": "sft.start_candidates",
    **{f"model.{name}": f"model.text.{name}" for name in _TEXT_SIZES.split()},
    **{f"model.vision_{name}": f"model.vision.{name}" for name in ("depth", "embed_dim", "num_heads")},
}
# Whole sections renamed: every field ``old.X`` is ``new.X`` now.
MOVED_SECTIONS = {"seed_selection": "start_selection"}
_told: set[str] = set()


def current_name(dotted: str, tell: bool = True) -> str:
    """The dotted field name as the settings spell it now (``MOVED``, ``MOVED_SECTIONS``); the first use of an old
    name (of an old section: any of its fields) says so."""
    head, dot, rest = dotted.partition(".")
    if head in MOVED_SECTIONS:
        old, new, dotted = head, MOVED_SECTIONS[head], MOVED_SECTIONS[head] + dot + rest
    elif dotted in MOVED:
        old, new, dotted = dotted, MOVED[dotted], MOVED[dotted]
    else:
        return dotted
    if tell and old not in _told:
        _told.add(old)
        print(f"config.{old} is config.{new} now; the old name still works", file=sys.stderr)
    return dotted


def relocated(values: Mapping[str, Any], tell: bool = True) -> dict:
    """A copy of nested setting ``values`` (a config file's, a recorded config.json) with old names moved (a field
    set under both names keeps the old name's value, as a flag of either name would set it). A section that old
    names move into starts, where ``values`` lack it, from its defaults: its other fields had no names before, so
    they held those values (a fresh model's ``model.text`` beyond its old sizes)."""
    out, default = copy.deepcopy(dict(values)), None
    for old in MOVED_SECTIONS:
        if isinstance(out.get(old), dict):
            fields = out.pop(old)
            new = current_name(old, tell)
            out[new] = {**out.get(new, {}), **fields} if isinstance(out.get(new), dict) else fields
    for old in MOVED:
        *parents, leaf = old.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            value = node.pop(leaf)
            *new_parents, new_leaf = current_name(old, tell).split(".")
            default = default or defaults(Settings)
            target, start = out, default
            for part in new_parents:
                start = start.get(part, {})
                target = target.setdefault(part, copy.deepcopy(start))
            target[new_leaf] = value
    return out


@dataclasses.dataclass(frozen=True)
class MeshSettings(Section):
    """Axis sizes of the ('data', 'fsdp', 'tensor') mesh; -1: every remaining device."""

    PATH: ClassVar[str] = "mesh"
    data: int = -1
    """Data-parallel axis size."""
    fsdp: int = 1
    """Parameter-sharding (FSDP) axis size."""
    tensor: int = 1
    """Tensor-parallel axis size."""

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
            raise SettingsError(
                f"config.mesh (data, fsdp, tensor) = {sizes}: sizes must be >= 1, with at most one -1 (all "
                "remaining devices)"
            )

    def shape(self, n_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) on ``n_devices``."""
        shape = [self.data, self.fsdp, self.tensor]
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = n_devices // known if n_devices % known == 0 else 0
        if math.prod(shape) != n_devices:
            raise SettingsError(
                f"config.mesh (data, fsdp, tensor) = ({self.data}, {self.fsdp}, {self.tensor}) does not fit "
                f"{n_devices} devices; set --config.mesh.data etc. so that their product is {n_devices}"
            )
        return tuple(shape)

    def batch_ways(self, n_devices: int) -> int:
        """How many ways the mesh splits a batch: its data x fsdp axes on ``n_devices``."""
        data, fsdp, _ = self.shape(n_devices)
        return data * fsdp


# ------------------------------------------------------------------------------------------------- the job


@dataclasses.dataclass(frozen=True)
class Settings(Section):
    """Every section of a job config. The defaults are ``configs/synthetic.py``'s ``full`` job, less its easier
    synthetic world (``world`` is ``WorldConfig``'s defaults); a config file changes what differs."""

    seed: int = 0
    """The job's seed (the world, initialization, samplers)."""
    data: DataSettings = dataclasses.field(default_factory=DataSettings)
    world: WorldConfig = dataclasses.field(default_factory=WorldConfig)
    """The synthetic world: every field of envs/synthetic/config.py's WorldConfig (its defaults)."""
    env: EnvSettings = dataclasses.field(default_factory=EnvSettings)
    """The live world the online evaluation and PPO / GiGPPO play (envs/sections.py)."""
    evolution: EvolutionSettings = dataclasses.field(default_factory=EvolutionSettings)
    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    buckets: BucketSettings = dataclasses.field(default_factory=BucketSettings)
    sft: SFTSettings = dataclasses.field(default_factory=SFTSettings)
    start_selection: StartSelectionSettings = dataclasses.field(default_factory=StartSelectionSettings)
    sampler: SamplerSettings = dataclasses.field(default_factory=SamplerSettings)
    reward: RewardSettings = dataclasses.field(default_factory=RewardSettings)
    ipl: IPLSettings = dataclasses.field(default_factory=IPLSettings)
    rl: RLSettings = dataclasses.field(default_factory=RLSettings)
    eval: EvalSettings = dataclasses.field(default_factory=EvalSettings)
    export: ExportSettings = dataclasses.field(default_factory=ExportSettings)
    ablation: AblationSettings = dataclasses.field(default_factory=AblationSettings)
    mesh: MeshSettings = dataclasses.field(default_factory=MeshSettings)
    pretrain: PretrainSettings = dataclasses.field(default_factory=PretrainSettings)

    def __post_init__(self):
        self.need("seed", 0 <= self.seed <= MAX_SEED, f"must be an integer in [0, {MAX_SEED}]")
        fmt = self.data.format
        synthetic_world = self.env.kind == "synthetic"
        if self.eval.online_episodes > 0 and synthetic_world and not self.data.synthetic:
            raise SettingsError(
                f"config.eval.online_episodes={self.eval.online_episodes}: online evaluation plays the synthetic "
                f"world (config.env.kind), but config.data.format is {fmt!r} (fix it with "
                "--config.eval.online_episodes=0)"
            )
        if self.sft.reading_episodes > 0 and not self.data.synthetic:
            raise SettingsError(
                f"config.sft.reading_episodes={self.sft.reading_episodes}: reading chats come from the synthetic "
                f"world, but config.data.format is {fmt!r} (fix it with --config.sft.reading_episodes=0)"
            )
        method = self.ipl.method
        if method == "sft_oracle" and not self.data.scarce:
            raise setting_error(
                "ipl.method",
                method,
                "trains on the CoaT of action-only episodes, and data.action_episodes is 0 (without them "
                "continued_sft already trains on the golden CoaT of the round's steps)",
            )
        if method in ("ppo", "gigppo") and synthetic_world and not self.data.synthetic:
            raise setting_error(
                "data.format", fmt, f"must be synthetic with ipl.method={method} in the synthetic world (online)"
            )
        if method == "gigppo" and self.rl.ppo.trajectories_per_task < 2:
            raise setting_error(
                "rl.ppo.trajectories_per_task",
                self.rl.ppo.trajectories_per_task,
                "must be >= 2 with gigppo (sibling states)",
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Settings:
        """Settings from a job config as nested dicts (a config file's sections, old names moved: ``relocated``);
        raises ``SettingsError``."""
        return section_from(cls, relocated(values), "")

    @classmethod
    def defaults(cls) -> dict:
        """Every field's default as nested dicts, one per section (what a config file starts from)."""
        return defaults(cls)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, values: Mapping[str, Any]) -> Settings:
        """These settings with ``{"section.field": value}`` changed (deeper paths too), checked again."""
        out = self.to_dict()
        for dotted, value in values.items():
            dotted = current_name(dotted)
            *parents, leaf = dotted.split(".")
            node = out
            for part in parents:
                node = node[part]
            if leaf not in node:
                raise SettingsError(f"config.{dotted}: no such field")
            node[leaf] = value
        return Settings.from_dict(out)

    def resolved(self, n_devices: int, default_dtype: str = "float32") -> Settings:
        """The settings a job runs with on ``n_devices``, made once at its entry: the model's dtypes concrete
        (``ModelSettings.resolved``: the checkpoint's config.json read here) and the mesh's sizes concrete
        (``MeshSettings.shape``; one device runs without a mesh: 1 x 1 x 1)."""
        mesh = MeshSettings(*self.mesh.shape(n_devices)) if n_devices > 1 else MeshSettings(1, 1, 1)
        return dataclasses.replace(self, model=self.model.resolved(default_dtype), mesh=mesh)

    def check_machine(self, platform: str, n_devices: int) -> None:
        """What depends on the machine: dtypes / attention / remat on ``platform``; with several devices, the mesh and
        the batches it splits."""
        self.model.check_platform(platform)
        if n_devices <= 1:
            return  # one device: the job runs without a mesh
        ways = self.mesh.batch_ways(n_devices)
        micro = "sft.micro_batch_size" if self.sft.micro_batch_size else "sft.batch_size"
        for field, size in (
            (micro, self.sft.micro),
            ("sampler.batch_size", self.sampler.batch_size),
            ("ipl.batch_size", self.ipl.batch_size),
            ("eval.batch_size", self.eval.batch_size),
        ):
            if size % ways:
                raise SettingsError(
                    f"config.{field}={size}: not divisible by the mesh's batch axes (data x fsdp = {ways} on "
                    f"{n_devices} devices), so every device would hold the whole batch; use a multiple of {ways}"
                )
