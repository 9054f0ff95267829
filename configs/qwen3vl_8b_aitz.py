"""Qwen3-VL-8B-Instruct on AITZ: the paper's main setting (qwen2vl_7b_aitz.py) on the Qwen3-VL model of its size.

    ipl-jax run --config qwen3vl_8b_aitz[:gpu|tpu] --config.data.root=/data/aitz \
        --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct --workdir runs/aitz3vl8b

Qwen3-VL cuts 16-pixel patches (32 x 32 pixels per image token): the buckets follow. Its chat template and special
tokens come with the checkpoint; the paper's hyper-parameters (paper_base.py) are kept.
"""

from ipl_jax.configs import paper_base as _base


def get_config(arg=None):
    c = _base.paper_config("aitz", max_pixels=1540 * 1540, train_samples=63_158, arg=arg, patch_size=16)
    c.data.test_splits = ("test",)
    return c
