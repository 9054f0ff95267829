"""Shared settings of the paper-scale configs (docs/method.md §7): Qwen2-VL checkpoints on the real benchmarks.

Not a job config by itself: ``qwen2vl_{2b,7b}_{aitz,amex,androidcontrol}.py`` call ``paper_config`` here.
``get_config`` arguments of those files pick the accelerator layout:

    gpu   (default) one host of 8 GPUs (80 GB each)
    tpu   a v5p-16 slice (8 chips, 95 GB each)

Both shard parameters, optimizer state and batches over every device (mesh fsdp = -1: 7B full-weight T-DPO does
not fit replicated), and their batches are multiples of 8, one micro-batch row / tree per device; on another
device count keep sft.micro_batch_size, sampler.batch_size and ipl.batch_size multiples of it (the job checks).

Paper hyper-parameters (Qwen2-VL-7B): warm-up SFT lr in [3e-6, 3e-5] with LoRA rank 128 for 2 epochs; IPL lr
1e-6 in round 1 and a constant 1e-7 after, one epoch per round; batch 128; the ViT trainable in SFT and frozen
in IPL; max resolution 1540x1540 on AITZ, 1280x720 elsewhere; AndroidControl samples 1/5 of its training
steps per round. What the paper leaves open is marked [choice].
"""

import importlib.util
from pathlib import Path


def _synthetic():
    spec = importlib.util.spec_from_file_location("_ipl_jax_synthetic_config", Path(__file__).with_name("synthetic.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config("full")  # every episode annotated: the paper's data, not the scarce default


def paper_config(fmt: str, max_pixels: int, train_samples: int, arg=None, patch_size: int = 14):
    """The job config for ``fmt`` (aitz | amex | androidcontrol); ``train_samples`` sizes the 2 SFT epochs;
    ``patch_size``: the checkpoint's (14 for Qwen2-VL, 16 for Qwen3-VL; an image token is 2 x 2 patches)."""
    c = _synthetic()
    if arg not in (None, "", "gpu", "tpu"):
        raise ValueError(f"unknown variant {arg!r} (expected 'gpu' or 'tpu')")
    c.data.format = fmt
    c.data.root = ""  # REQUIRED: --config.data.root=/path/to/<dataset>
    c.data.dev_split = ""  # no dev split in the published data: hold out the last training episodes
    c.data.dev_holdout = 100
    c.data.loader_threads = 16
    # AMEX and AndroidControl are published without CoaT: their SFT texts are made up from the UI elements and the
    # step instructions ([choice]; data/dialogue.py coat_turn_texts)
    c.data.coat_fallback = fmt in ("amex", "androidcontrol")

    c.evolution.per_step = 4
    c.evolution.max_items = 60_000  # [choice] about one Q&A per CoaT sample

    # REQUIRED: a local Hugging Face directory, e.g. huggingface-cli download Qwen/Qwen2-VL-7B-Instruct
    c.model.checkpoint = ""
    c.model.dtype = "auto"  # the checkpoint's bfloat16: bf16 compute, fp32 master weights and optimizer state
    c.model.remat = "full"
    c.model.min_pixels = 56 * 56
    c.model.max_pixels = max_pixels

    tokens = max_pixels // (2 * patch_size) ** 2 + 1024  # image tokens + the dialogue
    c.buckets.tokens = tuple(b for b in (1024, 1536, 2048, 3072, 4096, 6144) if b <= 2 * tokens) or (tokens,)
    c.buckets.patches = (-(-max_pixels // patch_size**2 // 4) * 4,)  # one image's patches, a multiple of 2x2
    c.buckets.max_turn_tokens = (256, 128, 32, 32)

    c.sft.batch_size = 128
    c.sft.micro_batch_size = 8  # [choice] gradient accumulation: one row per device of the 8 named
    c.sft.steps = 2 * train_samples // 128  # 2 epochs
    c.sft.learning_rate = 1e-5  # in the paper's [3e-6, 3e-5]
    c.sft.warmup_steps = 30
    c.sft.schedule = "cosine"
    c.sft.weight_decay = 0.0
    c.sft.checkpoint_every = max(50, c.sft.steps // 10)
    c.sft.start_candidates = 3
    c.sft.freeze_vision = False
    c.sft.lora_rank = 128

    c.start_selection.steps = 256
    c.start_selection.embedder = "minilm"

    c.sampler.tree.branching = (3, 3, 3, 1)
    c.sampler.temperature = 1.0
    c.sampler.batch_size = 8  # [choice] one tree per device: the 4th turn's KV cache of 16 trees passes 60 GB
    c.sampler.tree.prefix_buckets = tuple(b for b in (512, 1024, 2048, 3072, 4096) if b <= 2 * tokens) or (tokens,)
    c.sampler.tree.prompt_buckets = (64, 128, 256, 512)

    c.ipl.rounds = 4 if fmt == "aitz" else 2
    c.ipl.steps_per_round = 0  # every training step
    c.ipl.learning_rate = 1e-6
    c.ipl.later_learning_rate = 1e-7
    c.ipl.batch_size = 16  # packed prefix rows per step
    c.ipl.max_pairs_per_batch = 128  # the paper's batch of 128
    c.ipl.text_buckets = tuple(b for b in (1536, 2048, 3072, 4096, 6144) if b <= 2 * tokens) or (tokens,)
    c.ipl.freeze_vision = True
    # the paper's pairs as it states them (the synthetic default's measured choices are not carried over)
    c.ipl.gamma_pairs = "paper"
    c.ipl.selection.dedup = False
    c.ipl.selection.mix_trees = False
    c.ipl.lora_rank = 0
    c.ipl.early_stop = False

    c.eval.batch_size = 32
    c.eval.online_episodes = 0  # the published datasets have no live world to play episodes in

    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    return c
