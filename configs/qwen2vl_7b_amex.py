"""Qwen2-VL-7B-Instruct on AMEX (step accuracy per app).

    ipl-jax run --config qwen2vl_7b_amex[:gpu|tpu] --config.data.root=/data/amex \
        --config.model.checkpoint=/models/Qwen2-VL-7B-Instruct --workdir runs/amex7b
"""

from ipl_jax.configs import paper_base as _base


def get_config(arg=None):
    # [choice] AMEX's SFT size is not given per round: about the AITZ recipe's 2 epochs over ~40k samples
    c = _base.paper_config("amex", max_pixels=1280 * 720, train_samples=40_000, arg=arg)
    c.data.test_splits = ("test",)
    return c
