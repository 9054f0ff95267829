"""The TensorFlow Datasets builder ``ipl_aitz`` (the release as ``manual_dir``) and what every ipl-jax builder
shares (``dataset_info``, ``aitz_examples``; the synthetic world's ``ipl_synthetic`` is
``envs/synthetic/tfds_builder.py``): one example per step in reader order, in TFDS's ``array_record`` format (no
TensorFlow needed; ``tfds.load`` needs it).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from ipl_jax.data.aitz import load_aitz
from ipl_jax.data.packed.encoding import RECORD_VERSION, canonical_json, image_bytes, step_header
from ipl_jax.data.packed.writer import portable, source_splits

SCORING_FORMAT = "aitz"


def screenshot_png(data: bytes) -> bytes:
    """The screenshot as an 8-bit RGB PNG (TFDS decodes it as uint8[H, W, 3]); such a PNG is kept byte for byte."""

    img = Image.open(io.BytesIO(data))
    if img.format == "PNG" and img.mode == "RGB":
        return data
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


def features() -> tfds.features.FeaturesDict:
    """One step: episode_id, step_id, instruction, screenshot (PNG), action (``Action.to_json``) and ``record``, the
    full header of ``data.packed.encoding`` from which the exact ``Step`` is rebuilt."""
    return tfds.features.FeaturesDict(
        {
            "episode_id": tfds.features.Text(),
            "step_id": np.int32,
            "instruction": tfds.features.Text(),
            "screenshot": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
            "action": tfds.features.Text(),
            "record": tfds.features.Tensor(shape=(), dtype=np.object_),
        }
    )


def dataset_info(builder, description: str) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=builder,
        description=description,
        features=features(),
        disable_shuffling=True,  # keep each episode's steps consecutive and in order
        metadata=tfds.core.MetadataDict(scoring_format=SCORING_FORMAT, record_version=RECORD_VERSION),
    )


def aitz_examples(root: Path, split: str):
    """(key, example) for every step of an AITZ-layout split under ``root``, in reader order."""

    key = 0
    for ep in portable(load_aitz(root, split), [root]):
        for step in ep.steps:
            png = screenshot_png(image_bytes(step))
            header = step_header(step, ep, "png")
            yield (
                key,
                {
                    "episode_id": step.episode_id,
                    "step_id": int(step.step_id),
                    "instruction": step.instruction,
                    "screenshot": png,
                    "action": canonical_json(step.action.to_json()),
                    "record": canonical_json(header).encode("utf-8"),
                },
            )
            key += 1


class IplAitz(tfds.core.GeneratorBasedBuilder):
    """AITZ (Android-in-the-Zoo) from a local copy of the release, one example per step."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Download the AITZ release and point the manual directory at the folder holding its train/ and test/ "
        "folders (train/<subset>/<SUBSET>-<id>/<SUBSET>-<id>.json next to one PNG per step)."
    )

    def _info(self) -> tfds.core.DatasetInfo:
        return dataset_info(
            self,
            "AITZ (Android-in-the-Zoo): Android GUI episodes with Chain-of-Action-Thought "
            "annotations, read with ipl-jax's AITZ reader.",
        )

    def _split_generators(self, dl_manager):
        root = Path(dl_manager.manual_dir)
        splits = source_splits("aitz", root) if root.is_dir() else []
        if not splits:
            raise FileNotFoundError(f"{root}: no AITZ split folders (train/, test/) in the manual directory")
        return {split: self._generate_examples(root, split) for split in splits}

    def _generate_examples(self, root, split):
        yield from aitz_examples(Path(root), split)
