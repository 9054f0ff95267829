"""Qwen3-VL-30B-A3B-Instruct (the MoE: 128 experts, 8 per token) on AITZ: qwen3vl_8b_aitz.py's settings, with IPL's
T-DPO on LoRA adapters.

    ipl-jax run --config qwen3vl_30b_a3b_aitz[:gpu|tpu] --config.data.root=/data/aitz \
        --config.model.checkpoint=/models/Qwen3-VL-30B-A3B-Instruct --workdir runs/aitz3vl30b

[choice] Full-weight T-DPO (the paper's, ``--config.ipl.lora_rank=0``) keeps float32 master weights and two Adam
moments, 12 bytes a parameter: 31B parameters need 46 GB per device on 8 devices before any activation, too much
for 80 GB GPUs once the step's temporaries come (``ipl-jax plan``; docs/datasets.md), enough room on a v5p-16
slice's 95 GB chips. LoRA rank 128, as in warm-up SFT, trains adapters over a frozen bfloat16 base on both
variants (they are the same settings); on v5p-16 the paper's full-weight T-DPO is one override away.
"""

from ipl_jax.configs import paper_base as _base


def get_config(arg=None):
    c = _base.paper_config("aitz", max_pixels=1540 * 1540, train_samples=63_158, arg=arg, patch_size=16)
    c.data.test_splits = ("test",)
    c.ipl.lora_rank = 128
    return c
