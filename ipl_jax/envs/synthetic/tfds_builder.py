"""The TensorFlow Datasets builder ``ipl_synthetic``: episodes the synthetic world generates, written in the AITZ
layout and read back one example per step (``data.tfds.builders``' features and metadata). Importing this module
registers it; reading a prepared copy (``data.format = "tfds:ipl_synthetic/..."``) does not need it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tensorflow_datasets as tfds

from ipl_jax.data.tfds.builders import aitz_examples, dataset_info
from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
from ipl_jax.envs.synthetic.dataset import generate_split


@dataclasses.dataclass
class SyntheticConfig(tfds.core.BuilderConfig):
    """How many episodes of each split the world generates, and from which seed."""

    episodes: tuple = (("train", 1000), ("dev", 100), ("test", 200))
    seed: int = 0
    png_level: int = 1


class IplSynthetic(tfds.core.GeneratorBasedBuilder):
    """The synthetic GUI world's episodes, one example per step."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    BUILDER_CONFIGS = [
        SyntheticConfig(name="default", description="the job's default sizes (train 1000, dev 100, test 200)"),
        SyntheticConfig(
            name="tiny", description="a few episodes, for tests and demos", episodes=(("train", 6), ("test", 3))
        ),
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        return dataset_info(
            self,
            "Synthetic Android-like GUI episodes with CoaT annotations (ipl-jax's world), read "
            "through the AITZ layout.",
        )

    def _split_generators(self, dl_manager):

        cfg = self.builder_config
        root = Path(dl_manager.download_dir) / f"ipl_synthetic_{cfg.name}_seed{cfg.seed}"
        for split, n in cfg.episodes:
            if not (root / split).is_dir():
                write_aitz_split(
                    generate_split(split, int(n), seed=int(cfg.seed)),
                    root,
                    split,
                    compress_level=int(cfg.png_level),
                    with_meta=True,
                )
        return {split: self._generate_examples(root, split) for split, _ in cfg.episodes}

    def _generate_examples(self, root, split):
        yield from aitz_examples(Path(root), split)
