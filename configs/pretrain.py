"""The base model's pretraining (``ipl-jax pretrain``): the default job's world and model, trained from scratch to
read the world's screens (``ipl_jax/envs/synthetic/reading.py``) before warm-up SFT starts from it.

    ipl-jax pretrain --workdir runs/pretrain                    # this recipe (two CPU cores: see docs/pretrain.md)
    ipl-jax pretrain --config pretrain:quick --workdir /tmp/p   # a few steps of the same path (tests)

The ``sft`` section holds the pretraining's updates, batch and rate; ``pretrain`` the screens and questions.
"""

import ml_collections

from ipl_jax.configs import synthetic


def get_config(arg=None) -> ml_collections.ConfigDict:
    c = synthetic.get_config()  # the default job's world and model size, from scratch
    c.model.min_pixels = c.model.max_pixels = 224 * 448  # full resolution: 11-pixel text, 128 image tokens
    c.buckets.patches, c.buckets.tokens = (512,), (512, 640)
    c.sft.steps, c.sft.batch_size, c.sft.micro_batch_size = 1500, 16, 16
    c.sft.learning_rate, c.sft.warmup_steps, c.sft.checkpoint_every, c.sft.start_candidates = 2e-3, 100, 100, 1
    c.pretrain.episodes, c.pretrain.eval_episodes = 2000, 24
    if arg == "quick":
        c.model.text.num_hidden_layers, c.model.text.vocab_size = 2, 1024
        c.sft.steps, c.sft.batch_size, c.sft.micro_batch_size, c.sft.warmup_steps = 4, 4, 4, 1
        c.sft.checkpoint_every = 2
        c.pretrain.episodes, c.pretrain.eval_episodes, c.pretrain.where, c.pretrain.what = 6, 1, 1, 1
    elif arg not in (None, ""):
        raise ValueError(f"configs/pretrain.py: unknown variant {arg!r} (expected nothing or quick)")
    return c
