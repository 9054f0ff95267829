"""Qwen2-VL-7B-Instruct on AITZ (the paper's main setting).

    ipl-jax run --config qwen2vl_7b_aitz[:gpu|tpu] --config.data.root=/data/aitz \
        --config.model.checkpoint=/models/Qwen2-VL-7B-Instruct --workdir runs/aitz7b

AITZ: 1540x1540 max resolution; 63,158 SFT samples (CoaT steps + evolved Q&A), 4 IPL rounds.
"""

from ipl_jax.configs import paper_base as _base


def get_config(arg=None):
    c = _base.paper_config("aitz", max_pixels=1540 * 1540, train_samples=63_158, arg=arg)
    c.data.test_splits = ("test",)
    return c
