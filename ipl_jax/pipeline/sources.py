"""What a job needs from the disk and the machine before any stage runs: its dataset and starting checkpoint
(``check_sources``), and the settings that depend on the backend and the device count (``check_job``).

A job on a published benchmark reads its dataset from ``data.root`` (in the benchmark's layout, or packed by
``ipl-jax pack-data``) and starts from the Hugging Face checkpoint ``model.checkpoint``; the synthetic job needs
neither. Every failure is one ``UsageError`` / ``SettingsError`` line naming the config field and what to pass.
"""

from __future__ import annotations

from pathlib import Path

import jax

from ipl_jax.data.datasets import TFDS_PREFIX
from ipl_jax.data.packed.layout import is_packed
from ipl_jax.pipeline.paths import UsageError, model_dir
from ipl_jax.settings import DataSettings, ModelSettings, Settings

PUBLISHED = ("aitz", "amex", "androidcontrol")  # the benchmarks' own layouts (the paper configs read them)


def check_job(settings: Settings, n_devices: int | None = None, platform: str | None = None) -> None:
    """``check_sources``, then ``Settings.check_machine`` on ``platform`` / ``n_devices`` (default: JAX's)."""
    check_sources(settings.data, settings.model)
    settings.check_machine(platform or jax.default_backend(), jax.device_count() if n_devices is None else n_devices)


def check_sources(data: DataSettings, model: ModelSettings) -> None:
    """A job on a published benchmark needs its dataset directory and a starting checkpoint (a fresh model of the
    config's tiny size is meant for the synthetic world only); a packed or published dataset needs its
    directory, in its layout."""
    fmt, root, checkpoint = data.format, data.root, model.checkpoint
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
        model_dir(checkpoint, "config.model.checkpoint")


def _check_root(data: DataSettings) -> None:
    fmt, root = data.format, data.root
    if not root:
        raise UsageError(
            f"config.data.root is empty: the {fmt} job reads its dataset from disk; pass --config.data.root=DIR "
            f"(see README: Datasets)"
        )
    p = Path(root)
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
