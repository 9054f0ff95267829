"""Qwen2-VL-2B-Instruct on AITZ: the 7B recipe on the smaller model (fits one 24 GB+ GPU with LoRA in IPL).

    ipl-jax run --config qwen2vl_2b_aitz[:gpu|tpu] --config.data.root=/data/aitz \
        --config.model.checkpoint=/models/Qwen2-VL-2B-Instruct --workdir runs/aitz2b
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_ipl_jax_paper_base", Path(__file__).with_name("paper_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config(arg=None):
    c = _base.paper_config("aitz", max_pixels=1540 * 1540, train_samples=63_158, arg=arg)
    c.data.test_splits = ("test",)
    c.sft.learning_rate = 2e-5  # [choice] the upper half of the paper's range for the smaller model
    c.ipl.lora_rank = 64  # [choice] IPL with adapters: reference + policy + optimizer fit one GPU
    return c
