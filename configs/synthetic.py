"""The default job: a tiny Qwen2-VL-architecture model (a 4 x 128 decoder) trained from scratch on the synthetic GUI
world on a 2-core CPU, with scarce annotations: warm-up SFT on the CoaT of 30 episodes, IPL on 270 action-only ones.

    ipl-jax run --workdir runs/default                       # this config (the scarce setting)
    ipl-jax run --config synthetic:quick --workdir /tmp/q    # a smoke run of the same path (tests, the notebook)
    ipl-jax ablate --workdir runs/ablate                     # T-DPO against its controls, one start
    ipl-jax run --config synthetic:full ...                  # every training episode annotated (the old default)
    ipl-jax ablate --config synthetic:gpu ...                # a 30M-parameter policy at full resolution, one GPU

Each field's type, default and meaning: ``ipl_jax/settings/``; this file sets what differs (the world, the variants)
and any field can be overridden (``--config.sft.steps=1200``). What it measures: README ("What the main job shows"),
docs/scarce_job.md.
"""

import ml_collections

from ipl_jax.configs.loader import default_config


def get_config(arg=None) -> ml_collections.ConfigDict:
    c = default_config()  # "full": every training episode annotated
    # The synthetic world, easier than WorldConfig's defaults: canonical layouts (no shuffling or jitter), no
    # distractors, 2-6 extra apps, shorter lists -- learnable in minutes on a CPU.
    c.world.shuffle_layout = c.world.layout_jitter = False
    c.world.n_extra_apps, c.world.n_distractors = (2, 6), (0, 0)
    c.world.settings_rows, c.world.n_contacts, c.world.n_results = (9, 12), (4, 8), (3, 5)

    if arg in (None, "", "default", "scarce"):  # "scarce": the name this setting had before it became the default
        scarce(c)
    elif arg == "reader":  # the same job from the shipped screen reader (docs/pretrain.md: not yet the default)
        scarce(c)
        read(c)
    elif arg == "quick":
        scarce(c)
        quick(c)
    elif arg == "gpu":
        gpu(c)
    elif arg != "full":
        raise ValueError(
            f"configs/synthetic.py: unknown variant {arg!r} (expected nothing, reader, quick, full, scarce or gpu)"
        )
    return c


def read(c):
    """Start from the base model shipped with the package, ``builtin:reader``: the default model's size trained to
    read the world's screens at full resolution (224 x 448: 512 patches, 128 image tokens) by ``ipl-jax pretrain``
    (configs/pretrain.py; recipe and reading scores in docs/pretrain.md), as the paper starts from a pretrained
    vision-language model. Its tokenizer and shape come with it; the buckets fit 96 more image tokens. Not the
    default yet: its rounds gained nothing on seed 0 and seeds 0-4 are not re-measured from it (docs/pretrain.md)."""
    c.model.checkpoint = "builtin:reader"
    c.model.min_pixels = c.model.max_pixels = 224 * 448
    c.buckets.patches = (512,)
    c.buckets.tokens = (288, 352, 416, 480)


def quick(c):
    """The smallest end-to-end run of the default's path (tests, the notebook): every stage, a few steps each,
    warm-up SFT on 6 annotated episodes and the round on 18 action-only ones."""
    c.data.annotated_episodes, c.data.action_episodes = 6, 18
    c.data.train_episodes, c.data.dev_episodes, c.data.test_episodes = 24, 4, 4
    c.evolution.max_items = 48
    c.model.text.num_hidden_layers = 2
    c.model.text.vocab_size = 1024
    # one shape per program: nothing compiles twice
    c.buckets.tokens = (384,)
    c.sampler.tree.prefix_buckets = (128,)
    c.sampler.tree.prompt_buckets = (128,)
    c.ipl.text_buckets = (640,)
    c.sft.steps, c.sft.batch_size, c.sft.micro_batch_size, c.sft.checkpoint_every = 8, 4, 4, 4
    c.sft.warmup_steps, c.sft.start_candidates = 2, 2
    c.start_selection.steps, c.start_selection.embedder = 4, "tfidf"
    c.sampler.tree.branching, c.sampler.batch_size = (2, 2, 2, 1), 4
    c.ipl.rounds = c.ablation.rounds = 1
    c.ipl.steps_per_round, c.ipl.batch_size = 4, 4
    c.ipl.diagnostic_steps, c.ipl.heldout_steps = 4, 4
    # an 8-step SFT policy's thoughts never name the golden action, so "consistent" γ pairs would leave its few
    # trees without a single pair: the smoke run takes the paper's pairs so that every stage has work
    c.ipl.gamma_pairs = "paper"
    c.eval.batch_size = 4
    c.eval.online_episodes, c.eval.online_max_steps = 4, 6
    # RL baselines at the quick round's budget (4 steps x 8 leaves = 32 completions): 4 GRPO prompts x 8; PPO
    # in batches of 2 tasks x 2 trajectories of at most 4 steps
    c.rl.row_buckets = (640,)
    c.rl.ppo.tasks_per_batch, c.rl.ppo.trajectories_per_task, c.rl.ppo.minibatch_rows = 2, 2, 8
    c.rl.ppo.max_steps, c.rl.ppo.critic_warmup, c.rl.ppo.policy_updates = 4, 1, 1
    c.export.viewer_steps = 2
    c.ipl.selection.type_balance = 0.0  # 4 steps a round: keep every pair so that the round has updates


def scarce(c):
    """Scarce annotations, the setting IPL's rule reward is made for: warm-up SFT on the golden CoaT of N episodes; the
    rounds sample trees on M >> N further episodes read as action logs (golden action only), which supervised training
    cannot use. ``ipl-jax ablate`` compares, from one starting policy at one sample budget, T-DPO with rejection
    sampling (``no_negatives``), naive DPO, more SFT on the N annotated episodes (``continued_sft``) and SFT on the
    hidden CoaT of the M episodes (``sft_oracle``, an upper bound). N, M, the rounds and the round's optimizer are
    fields (data.annotated_episodes / action_episodes, ipl.rounds, ipl.learning_rate, ipl.schedule, ...). Three rounds,
    each from the last, at lr 1e-4 (the best of 2e-5 / 1e-4 / 3e-4 for T-DPO on seed 0) and DPO's β 0.5 (at 0.1 the
    preference term left T-DPO level with rejection sampling; docs/rounds.md), all three run (dev picks the exported
    round), pairs balanced over action types (ipl.selection.type_balance = 1: without it the rounds trade PRESS steps
    for CLICK; docs/scarce_tuning.md), sibling (β) pairs only; intermediate rounds evaluated on dev only."""
    c.data.annotated_episodes, c.data.action_episodes = 30, 270
    c.data.train_episodes = 300
    c.sft.steps, c.sft.checkpoint_every, c.sft.start_candidates = 600, 100, 1
    c.start_selection.steps = 8
    c.ipl.rounds = c.ablation.rounds = 3
    c.ipl.early_stop = False  # dev (12 episodes) is too small to stop on: it cut 4 of 5 seeds after round 1
    c.ipl.steps_per_round = 48
    c.ipl.learning_rate = 1e-4
    c.ipl.dpo.beta = 0.5
    c.ipl.selection.type_balance = 1.0
    # β pairs only: the γ pairs (golden vs sampled in trees without a correct leaf) did not help on seeds 0-4
    # (T-DPO with them minus without, after round 3: -0.7 ± 1.6 points; docs/rounds.md)
    c.ipl.gamma_pairs = "none"
    c.ipl.diagnostic_steps, c.ipl.heldout_steps = 12, 8
    c.eval.every_round = False
    c.ablation.variants = ("tdpo", "no_negatives", "continued_sft", "sft_oracle")


def gpu(c):
    """A policy for one GPU: about 30M parameters (decoder 8 x 512, vision tower 4 x 256) that sees the world's
    screenshots at full resolution (224 x 448: 512 patches, 128 image tokens), bfloat16 compute, warm-up SFT of
    1200 steps of 32, 256 sampled steps per round in tree batches of 32, three rounds, the test splits and the
    blank-screen control after the last round only, no live-world episodes. One shape per program (a single bucket
    each: on a GPU padding is cheaper than another compilation) and 8 loader threads. Sized so that
    ``ipl-jax ablate --variants tdpo,continued_sft,no_negatives`` of one seed fits about 8 minutes on one H200: an
    estimate from the programs' FLOPs and compilations (docs/scarce_job.md), not yet measured."""
    c.model.text.hidden_size, c.model.text.intermediate_size, c.model.text.num_hidden_layers = 512, 1536, 8
    c.model.text.num_attention_heads, c.model.text.num_key_value_heads = 8, 4
    c.model.vision.depth, c.model.vision.embed_dim, c.model.vision.num_heads = 4, 256, 4
    c.model.dtype = "bfloat16"
    c.model.min_pixels = c.model.max_pixels = 224 * 448
    c.data.loader_threads = 8
    c.buckets.patches = (512,)
    c.buckets.tokens = (480,)  # the longest dialogue of the default's 384 bucket + 96 more image tokens
    c.sampler.tree.prefix_buckets = (192,)  # system + image + turn-1 prompt: 161 tokens
    c.sampler.tree.prompt_buckets = (192,)
    c.ipl.text_buckets = (768,)
    c.sft.steps, c.sft.batch_size, c.sft.micro_batch_size = 1200, 32, 32
    c.sft.learning_rate, c.sft.warmup_steps, c.sft.checkpoint_every = 1e-3, 100, 400
    c.sampler.batch_size = 32
    c.eval.batch_size = 64
    c.ipl.rounds = c.ablation.rounds = 3
    c.ipl.steps_per_round = 256
    c.ipl.batch_size, c.ipl.max_pairs_per_batch = 16, 32
    c.ipl.diagnostic_steps, c.ipl.heldout_steps = 32, 32
    c.eval.every_round = False
    c.eval.online_episodes = 0  # its greedy programs would be compiled for this alone
    c.ablation.variants = ("tdpo", "continued_sft", "no_negatives")
