"""Qwen2-VL-2B-Instruct on AITZ: the 7B recipe on the smaller model (fits one 24 GB+ GPU with LoRA in IPL).

    ipl-jax run --config qwen2vl_2b_aitz[:gpu|tpu] --config.data.root=/data/aitz \
        --config.model.checkpoint=/models/Qwen2-VL-2B-Instruct --workdir runs/aitz2b
"""

from ipl_jax.configs import qwen2vl_7b_aitz as _aitz_7b


def get_config(arg=None):
    return smaller_model(_aitz_7b.get_config(arg))


def smaller_model(c):
    """What the 2B models change in their larger sibling's recipe."""
    c.sft.learning_rate = 2e-5  # [choice] the upper half of the paper's range for the smaller model
    c.ipl.lora_rank = 64  # [choice] IPL with adapters: reference + policy + optimizer fit one GPU
    return c
