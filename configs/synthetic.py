"""The default job: a tiny Qwen2-VL-architecture model trained from scratch on the synthetic GUI world, on a CPU.

    ipl-jax run --workdir runs/default                       # this config
    ipl-jax run --config synthetic:quick --workdir /tmp/q    # a smaller variant (tests, notebook)
    ipl-jax run --config.sft.steps=600 ...                   # any field can be overridden

Sizes are chosen for a 2-core CPU: 224x448 screenshots (128 image tokens after the 2x2 merge), a 4-layer
decoder of width 128, a BPE vocabulary of 2048 trained on the world's own texts.
"""

import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.seed = 0

    # ------------------------------------------------------------------ data: the synthetic world
    c.data = ml_collections.ConfigDict()
    c.data.format = "synthetic"  # synthetic | aitz | amex | androidcontrol
    c.data.root = ""  # for the real datasets: their local directory
    c.data.train_episodes = 400
    c.data.dev_episodes = 40
    c.data.test_episodes = 80
    c.data.test_splits = ("test", "test_app_unseen", "test_task_unseen")
    c.data.world = ""  # WorldConfig overrides as "k=v,k=v"

    # ------------------------------------------------------------------ instruction evolution
    c.evolution = ml_collections.ConfigDict()
    c.evolution.enabled = True
    c.evolution.levels = (1, 2, 3)
    c.evolution.per_step = 2  # Q&A items per training screen
    c.evolution.max_items = 1200

    # ------------------------------------------------------------------ model (from scratch)
    c.model = ml_collections.ConfigDict()
    c.model.checkpoint = ""  # a Hugging Face directory to start from; empty = a fresh model of the size below
    c.model.vocab_size = 2048
    c.model.hidden_size = 128
    c.model.intermediate_size = 384
    c.model.num_hidden_layers = 4
    c.model.num_attention_heads = 4
    c.model.num_key_value_heads = 2
    c.model.vision_depth = 2
    c.model.vision_embed_dim = 64
    c.model.vision_num_heads = 4
    c.model.tie_word_embeddings = True
    c.model.min_pixels = 224 * 448
    c.model.max_pixels = 224 * 448

    # ------------------------------------------------------------------ sequence buckets
    c.buckets = ml_collections.ConfigDict()
    c.buckets.tokens = (256, 320, 384, 448)
    c.buckets.patches = (512,)
    c.buckets.max_turn_tokens = (48, 40, 12, 16)  # per CoaT turn: description, thought, action, grounding

    # ------------------------------------------------------------------ warm-up SFT
    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 900
    c.sft.batch_size = 16
    c.sft.learning_rate = 2e-3
    c.sft.warmup_steps = 50
    c.sft.schedule = "cosine"
    c.sft.weight_decay = 0.01
    c.sft.grad_clip = 1.0
    c.sft.checkpoint_every = 200
    c.sft.seed_candidates = 2  # checkpoints (the last N saved) scored for seed selection

    # ------------------------------------------------------------------ CoaT-tree sampling
    c.sampler = ml_collections.ConfigDict()
    c.sampler.branching = (3, 3, 3, 1)
    c.sampler.temperature = 1.0
    c.sampler.top_k = 0
    c.sampler.top_p = 1.0
    c.sampler.batch_size = 8

    # ------------------------------------------------------------------ rewards / values
    c.reward = ml_collections.ConfigDict()
    c.reward.v_type = 0.1
    c.reward.v_format = 0.1
    c.reward.discount = 0.95

    # ------------------------------------------------------------------ IPL rounds (T-DPO)
    c.ipl = ml_collections.ConfigDict()
    c.ipl.rounds = 2
    c.ipl.steps_per_round = 160  # training steps (screens) whose trees are sampled each round
    c.ipl.method = "tdpo"  # tdpo | naive_dpo | no_negatives
    c.ipl.loss_kind = "sigmoid"  # sigmoid | ipo | hinge
    c.ipl.beta = 0.1
    c.ipl.sft_weight = 1.0
    c.ipl.learning_rate = 2e-4
    c.ipl.batch_size = 8
    c.ipl.max_pairs_per_tree = 12
    c.ipl.freeze_vision = True
    c.ipl.early_stop = True

    # ------------------------------------------------------------------ evaluation
    c.eval = ml_collections.ConfigDict()
    c.eval.batch_size = 16
    c.eval.max_steps = 0  # 0 = every step of each split

    # ------------------------------------------------------------------ mesh (axis sizes; -1 = the rest)
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1

    if arg == "quick":  # the smallest end-to-end run: tests and the notebook
        c.data.train_episodes, c.data.dev_episodes, c.data.test_episodes = 40, 8, 12
        c.data.test_splits = ("test",)
        c.evolution.max_items = 100
        c.model.num_hidden_layers = 2
        c.sft.steps, c.sft.batch_size, c.sft.checkpoint_every = 40, 8, 20
        c.ipl.rounds, c.ipl.steps_per_round = 1, 16
        c.sampler.branching = (2, 2, 2, 1)
    elif arg not in (None, "", "default"):
        raise ValueError(f"configs/synthetic.py: unknown variant {arg!r} (expected 'quick' or nothing)")
    return c
