"""Qwen2-VL-7B-Instruct on AndroidControl (IDD / app-unseen / task-unseen / category-unseen subsplits).

    ipl-jax run --config qwen2vl_7b_androidcontrol[:gpu|tpu] --config.data.root=/data/android_control \
        --config.model.checkpoint=/models/Qwen2-VL-7B-Instruct --workdir runs/ac7b

AndroidControl has a validation split (used as dev) and samples 1/5 of its training steps per IPL round.
"""

from ipl_jax.configs import paper_base as _base


def get_config(arg=None):
    # [choice] SFT samples: 2 epochs over ~75k high-level steps
    c = _base.paper_config("androidcontrol", max_pixels=1280 * 720, train_samples=75_000, arg=arg)
    c.data.dev_split = "validation"
    c.data.test_splits = ("test",)
    c.ipl.steps_per_round = 0
    c.ipl.round_fraction = 0.2  # the paper: 1/5 of the data per round
    return c
