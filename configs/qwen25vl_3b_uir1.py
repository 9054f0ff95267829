"""Qwen2.5-VL-3B-Instruct trained the UI-R1 way: rule-based GRPO on a small set of hard low-level mobile steps.

    ipl-jax run --config qwen25vl_3b_uir1[:think|dast|nothink] --config.data.root=/data/android_control \\
        --config.model.checkpoint=/models/Qwen2.5-VL-3B-Instruct --workdir runs/uir1

``uir1_published`` holds UI-R1's published recipe (its appendix: 8 GPUs of 24 GB, 136 training steps, the
<think>/<answer> prompt, type + click-in-box + format rewards; UI-R1-E's two stages: ``:dast``, ``:nothink``);
``get_config`` sets what the job's ``rl.grpo`` section has fields for. The loss settings the paper leaves out
come from docs/method.md §11; [choice] marks the rest (data: AndroidControl). ``QWEN25VL_3B`` is the published
3B config.json (flat Hub layout); ``c.model`` repeats its sizes.
"""

from ipl_jax.configs import paper_base as _base

MAX_PIXELS = 12_845_056  # UI-R1's training value (= 16384 merged tokens of 28x28 pixels)

QWEN25VL_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "hidden_act": "silu",
        "out_hidden_size": 2048,
        "in_chans": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
    },
}


def get_config(arg=None):
    stage = arg or "think"
    if stage not in ("think", "dast", "nothink"):
        raise ValueError(f"configs/qwen25vl_3b_uir1.py: unknown variant {arg!r} (expected think, dast or nothink)")
    c = _base.paper_config("androidcontrol", max_pixels=MAX_PIXELS, train_samples=136)  # data parallel, like UI-R1
    c.data.dev_split = "validation"
    c.data.test_splits = ("test",)
    c.model.min_pixels = 56 * 56  # the Hub processor's value
    arch, vis = QWEN25VL_3B, QWEN25VL_3B["vision_config"]
    text_fields = ("vocab_size", "hidden_size", "intermediate_size")
    for name in (*text_fields, "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        c.model.text[name] = arch[name]
    c.model.vision.depth = vis["depth"]
    c.model.vision.embed_dim = vis["hidden_size"]  # Qwen2.5-VL's HF name of the ViT width
    c.model.vision.num_heads = vis["num_heads"]
    c.model.tie_word_embeddings = arch["tie_word_embeddings"]

    # A phone screenshot (1080x2400) keeps its size under this max_pixels: about 3.4k image tokens, 13.4k patches;
    # the largest image allowed is 16384 tokens (65536 patches). [choice] buckets cover both.
    c.buckets.tokens = (2048, 4096, 6144, 8192, 12288, 17408)
    c.buckets.patches = (4096, 8192, 16384, 32768, 65536)

    # the learner: GRPO with UI-R1's rule reward and its <think>/<answer> prompt, as far as the job's rl.grpo
    # section has the settings; the rest of the published recipe is uir1_published's (below)
    published = uir1_published(stage)
    c.ipl.method = "grpo"
    c.rl.grpo.style = "think_answer"
    for name in ("group_size", "learning_rate", "clip_eps", "kl_beta", "dast"):
        c.rl.grpo[name] = published[name]
    c.rl.grpo.prompts_per_batch = published["prompts_per_update"]
    c.ipl.freeze_vision = published["freeze_vision"]
    return c


def uir1_published(stage: str = "think") -> dict:
    """UI-R1's published training settings of a stage (think, dast, nothink). The job's GRPO round reads
    group_size, learning_rate, prompts_per_update, clip_eps, kl_beta, dast and freeze_vision (``get_config``);
    the others (epochs, the decaying schedule, the prompt and answer lengths, the advantage epsilon, the
    <think>-free stage) have no setting in the job: a round spends the T-DPO round's budget instead."""
    return {
        "prompt_style": "uir1",  # <think>...</think><answer>[{action: ..., coordinate: [x, y]}]</answer>
        "group_size": 8,  # num_generations
        "epochs": 4 if stage in ("dast", "nothink") else 8,  # UI-R1-E: 4 epochs of DAST, then 4 of NOTHINK
        "learning_rate": 9.98e-7,  # the published start value, decaying to 0
        "schedule": "linear",  # [choice] the trainer's default decay to 0 that the published range implies
        "prompts_per_update": 16,  # per-device batch 1 x 2 accumulation steps x 8 GPUs
        "micro_batch_size": 1,
        "max_prompt_length": 1024,
        "max_new_tokens": 512,  # [choice] not published; L_max of the DAST budget
        "temperature": 1.0,  # [choice] sampling at the trainer's default temperature
        "clip_eps": 0.2,  # docs/method.md §11
        "kl_beta": 0.04,  # docs/method.md §11, k3 estimator
        "adv_eps": 1e-4,  # docs/method.md §11: (r - mean) / (std + adv_eps)
        "dast": stage == "dast",
        "think": stage != "nothink",
        "lora_rank": 0,  # [choice] full fine-tuning, like the paper's 3B runs
        "freeze_vision": True,  # [choice] not published; the ViT stays as pretrained
    }
