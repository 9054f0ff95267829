"""What a job needs before any stage runs: its dataset and starting checkpoint (``check_sources``), its live
world's servers (``check_env``) and the backend-dependent settings (``check_job``); failures are one-line usage /
settings errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax

from ipl_jax import storage
from ipl_jax.data.datasets import TFDS_PREFIX
from ipl_jax.data.packed.layout import is_packed, read_metadata
from ipl_jax.envs import check_envs
from ipl_jax.envs.protocol import EnvError
from ipl_jax.pipeline.paths import UsageError, model_dir
from ipl_jax.settings import DataSettings, ModelSettings, Settings

PUBLISHED = ("aitz", "amex", "androidcontrol")  # the benchmarks' own layouts (the paper configs read them)
NO_COAT = ("amex", "androidcontrol")  # published without CoaT annotations
# where each layout keeps its training split (data.action_root)
TRAIN_SPLIT = {
    "aitz": "AITZ layout: ROOT/train/<subset>/<episode>/",
    "amex": "AMEX layout: ROOT/instruction_anno/train/<episode>.json",
    "androidcontrol": "AndroidControl layout: a 'train' list in ROOT/splits.json",
    "arrayrecord": "packed by ipl-jax pack-data: a train split in ROOT/ipl_jax_arrayrecord.json",
}


def check_job(settings: Settings, n_devices: int | None = None, platform: str | None = None) -> None:
    """``check_sources`` and ``check_env``, then ``Settings.check_machine`` on ``platform`` / ``n_devices``
    (default: JAX's)."""
    check_sources(settings.data, settings.model)
    if settings.eval.online_episodes > 0 or settings.ipl.method in ("ppo", "gigppo"):
        check_env(settings, "config.env")
    logs = settings.data.log_format
    if settings.ipl.method == "sft_oracle" and settings.data.action_root and logs in NO_COAT:
        raise UsageError(
            f"config.ipl.method='sft_oracle' trains on the CoaT of the action logs, and config.data.action_root is "
            f"{logs} data, published without CoaT; leave sft_oracle out (ipl-jax ablate --variants ...)"
        )
    settings.check_machine(platform or jax.default_backend(), jax.device_count() if n_devices is None else n_devices)


def check_env(settings: Settings, where: str, check=None) -> None:
    """The live world's servers up and healthy (``envs.check_envs``; ``check(url)`` replaces the client's), else one
    ``UsageError`` line naming ``where`` (the settings or the flag) and the URL."""
    try:
        check_envs(settings.env, check)
    except EnvError as e:
        raise UsageError(f"{where}: {e}") from None


def check_sources(data: DataSettings, model: ModelSettings) -> None:
    """A benchmark job needs its dataset directory in its layout and a starting checkpoint; ``data.action_root``
    needs a training split in ``data.log_format``'s layout."""
    fmt, root, checkpoint = data.format, data.root, model.checkpoint
    if data.action_root:
        _check_action_root(data)
    if fmt in PUBLISHED and not root and not checkpoint:
        raise UsageError(
            f"config.data.root and config.model.checkpoint are empty: a job on {fmt} data reads its dataset from "
            f"disk and starts from a Hugging Face checkpoint; pass --config.data.root=DIR "
            f"--config.model.checkpoint=DIR (see README: Datasets)"
        )
    if fmt in PUBLISHED and not checkpoint:
        raise UsageError(
            f"config.model.checkpoint is empty: a job on {fmt} data starts from a Hugging Face checkpoint; pass "
            f"--config.model.checkpoint=DIR (e.g. a local Qwen2-VL-7B-Instruct download)"
        )
    if not data.synthetic and not fmt.startswith(TFDS_PREFIX):
        _check_root(data)
    if checkpoint:
        model_dir(model.checkpoint_dir(), "config.model.checkpoint")


def _check_root(data: DataSettings) -> None:
    fmt, root = data.format, data.root
    if not root:
        raise UsageError(
            f"config.data.root is empty: the {fmt} job reads its dataset from disk; pass --config.data.root=DIR "
            f"(see README: Datasets)"
        )
    p = _root_path(root, "config.data.root")
    if not p.is_dir():
        raise UsageError(
            f"config.data.root={root!r}: no such directory; pass --config.data.root=DIR holding the {fmt} dataset "
            f"(see README: Datasets)"
        )
    if fmt not in PUBLISHED or is_packed(p):
        return
    if fmt == "aitz":
        missing = [s for s in data.split_names() if not (p / s).is_dir()]
        if missing:
            raise UsageError(
                f"config.data.root={root!r}: no split folder {', '.join(missing)} (AITZ layout: "
                f"ROOT/<split>/<subset>/<episode>/; see README: Datasets)"
            )
    elif fmt == "amex" and not (p / "instruction_anno").is_dir():
        raise UsageError(f"config.data.root={root!r}: no instruction_anno/ folder (AMEX layout; see README: Datasets)")
    elif fmt == "androidcontrol" and not (p / "splits.json").is_file():
        raise UsageError(f"config.data.root={root!r}: no splits.json (AndroidControl layout; see README: Datasets)")


def _check_action_root(data: DataSettings) -> None:
    """``data.action_root`` is a directory holding a training split in ``data.log_format``'s layout."""
    root, fmt = data.action_root, data.log_format
    p = _root_path(root, "config.data.action_root")
    if not p.is_dir():
        raise UsageError(
            f"config.data.action_root={root!r}: no such directory; pass --config.data.action_root=DIR holding the "
            f"action logs ({fmt} layout)"
        )
    if fmt.startswith(TFDS_PREFIX):
        return  # a prepared TFDS dataset: its reader names what is missing
    if fmt == "arrayrecord" or is_packed(p):
        try:
            found, fmt = "train" in read_metadata(p)["splits"], "arrayrecord"
        except (OSError, ValueError) as e:
            raise UsageError(f"config.data.action_root={root!r}: {e}") from None
    elif fmt == "androidcontrol":
        found = (p / "splits.json").is_file() and "train" in _json_object(p / "splits.json", root)
    else:
        found = (p / ("train" if fmt == "aitz" else "instruction_anno/train")).is_dir()
    if not found:
        raise UsageError(
            f"config.data.action_root={root!r}: no train split ({TRAIN_SPLIT[fmt]}); the action logs are read "
            f"from a dataset's training split"
        )


def _root_path(root: str, field: str):
    """``root`` as a path to check: a local ``Path``; a URI checked on its store first (``storage.check_location``:
    one line naming it and the fix)."""
    try:
        storage.check_location(root)
    except storage.LocationError as e:
        raise UsageError(f"{field}={e}") from None
    return storage.as_path(root)


def _json_object(path: Path, root: str) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"config.data.action_root={root!r}: {path.name} unreadable ({e})") from None
    return value if isinstance(value, dict) else {}
