"""Tokenised SFT examples of the small model (``small_models.tiny_cfg``) of different lengths and image sizes, and
a batch layout of 2 micro-batches of 4 rows, for the tests of per-process batch building."""

import numpy as np

from ipl_jax.data.batching import TrainingExample
from ipl_jax.pipeline.sft_stage import BatchShape
from ipl_jax.settings import BucketSettings

from .small_models import IMG, VE, VS, tiny_cfg
from .trees import assert_trees_equal


def setup(n: int = 8, seed: int = 0):
    """(cfg, layout: (BucketSettings, BatchShape), tokenizer stand-in, n TrainingExamples); example lengths spread
    over two token buckets."""
    cfg = tiny_cfg()
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        h, w = 4, (4, 6)[i % 2]
        tail = int(rng.integers(4, 10)) + (20 if i in (1, 3) else 0)  # rows 1 and 3 need the larger bucket
        ids = np.asarray([*rng.integers(3, 59, 3), VS, *[IMG] * (h * w // 4), VE, *rng.integers(3, 59, tail)])
        loss = np.zeros(len(ids), np.int32)
        loss[-3:] = 1
        pixels = rng.normal(size=(h * w, cfg.vision.patch_dim)).astype(np.float32)
        examples.append(
            TrainingExample(ids.astype(np.int32), loss, loss.copy(), pixels, np.asarray([[1, h, w]]), f"ex{i}")
        )
    layout = (BucketSettings(tokens=(24, 48), patches=(32,), max_turn_tokens=(8, 8, 8, 8)), BatchShape(n, n // 2))

    class Ids:
        pad = 0

    class Tokenizer:
        ids = Ids()

    return cfg, layout, Tokenizer(), examples


assert_same = assert_trees_equal  # two batches: same structure, shapes, dtypes and values
