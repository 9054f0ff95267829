"""Qwen3-VL-2B-Instruct on AITZ: the 8B recipe on the smaller model (qwen2vl_2b_aitz.py's choices).

    ipl-jax run --config qwen3vl_2b_aitz[:gpu|tpu] --config.data.root=/data/aitz \
        --config.model.checkpoint=/models/Qwen3-VL-2B-Instruct --workdir runs/aitz3vl2b
"""

from ipl_jax.configs import qwen3vl_8b_aitz as _aitz_8b
from ipl_jax.configs.qwen2vl_2b_aitz import smaller_model


def get_config(arg=None):
    return smaller_model(_aitz_8b.get_config(arg))
