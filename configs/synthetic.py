"""The default job: a tiny Qwen2-VL-architecture model trained from scratch on the synthetic GUI world, on a CPU,
with scarce annotations: warm-up SFT on the CoaT of a few episodes, IPL rounds on many more action-only ones.

    ipl-jax run --workdir runs/default                       # this config (the scarce setting)
    ipl-jax run --config synthetic:quick --workdir /tmp/q    # a smoke run of the same path (tests, the notebook)
    ipl-jax ablate --workdir runs/ablate                     # T-DPO against its controls from one seed
    ipl-jax run --config synthetic:full ...                  # every training episode annotated (the old default)
    ipl-jax ablate --config synthetic:gpu ...                # a 30M-parameter policy at full resolution, one GPU
    ipl-jax run --config.sft.steps=1200 ...                  # any field can be overridden

Sizes fit a 2-core CPU: the world's 224x448 screenshots seen at half size (32 image tokens after the 2x2
merge), a 4-layer decoder of width 128, a BPE vocabulary of at most 2048 trained on the world's own texts, and
the world's easier settings (canonical layouts, no distractors, shorter lists). The job reads each section into
the typed settings of ``ipl_jax/settings/``; what it measures: README ("The main job", "Measured outcome").
"""

import ml_collections

from ipl_jax.configs.sections import rl_section, world_section


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.seed = 0

    # ------------------------------------------------------------------ data: the synthetic world
    c.data = ml_collections.ConfigDict()
    c.data.format = "synthetic"  # synthetic | aitz | amex | androidcontrol | arrayrecord | tfds:NAME
    c.data.root = ""  # for the real datasets: their local directory
    c.data.train_episodes = 300
    c.data.dev_episodes = 12
    c.data.test_episodes = 40  # per test split (about 225 steps each: a 95 % interval of a gain is about ±2.5 points)
    c.data.test_splits = ("test", "test_app_unseen", "test_task_unseen")
    c.data.dev_split = "dev"  # "" (real AITZ has no dev split): hold out the last `dev_holdout` train episodes
    c.data.dev_holdout = 20
    c.data.png_level = 1  # PNG compression of the written screenshots (1: fast, files a bit larger)
    c.data.loader_threads = 2  # Grain threads building SFT batches
    c.data.store = "aitz"  # how the job writes the synthetic world: aitz (directory tree) | arrayrecord (shards)
    c.data.shards = 1  # ArrayRecord shards per split when store = arrayrecord
    c.data.skip_bad = False  # True: leave malformed dataset records out (counted and reported) instead of stopping
    # Steps without a CoaT annotation: supervised paths (warm-up SFT, continued SFT) leave them out and say how many;
    # True makes up their texts instead (element list, step instruction: datasets published without CoaT)
    c.data.coat_fallback = False
    # Scarce annotations (the `scarce` variant): with action_episodes M > 0, a seeded choice of annotated_episodes N
    # training episodes keeps its CoaT (warm-up SFT, evolution, continued SFT) and M others are read as action logs
    # (golden action, screen and history only), which the IPL rounds sample; N + M <= the training episodes
    c.data.annotated_episodes = 0
    c.data.action_episodes = 0
    c.data.action_root = ""  # logs from another dataset's train split: N (0: all) of root's annotated, M (0: all) of it
    c.data.action_format = ""  # its format: aitz | amex | android_control | arrayrecord | tfds:NAME ("": data.format)

    # ------------------------------------------------------------------ the synthetic world (data/synthetic/config.py)
    # Every WorldConfig field. The default: canonical layouts (no shuffling or jitter), no distractors, 2-6 extra
    # apps, shorter lists -- learnable in minutes on a CPU.
    c.world = world_section(
        shuffle_layout=False,
        layout_jitter=False,
        n_extra_apps=(2, 6),
        n_distractors=(0, 0),
        settings_rows=(9, 12),
        n_contacts=(4, 8),
        n_results=(3, 5),
    )

    # ------------------------------------------------------------------ instruction evolution
    c.evolution = ml_collections.ConfigDict()
    c.evolution.enabled = True
    c.evolution.levels = (1, 2, 3)
    c.evolution.per_step = 2  # Q&A items per training screen
    c.evolution.max_items = 1200
    # screens the Q&A are asked about: "all" training screens (the action-only episodes' too: a Q&A needs the screen
    # and its UI elements, not a CoaT annotation) or only the "annotated" ones
    c.evolution.screens = "annotated"

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
    # Precision: compute dtype ('auto' = the starting checkpoint's torch_dtype, float32 for a fresh model) and the
    # storage dtype of the weights the job does not train (sampler, evaluator, frozen reference, frozen base;
    # 'auto' = the compute dtype). Trained weights and optimizer moments are always float32.
    c.model.dtype = "auto"
    c.model.param_dtype = "auto"
    c.model.attention = "auto"  # auto (per backend) | reference | xla | cudnn (jax.nn.dot_product_attention)
    c.model.remat = "none"  # training: none | full | dots_saveable | dots_no_batch | offload
    # The world renders 224x448 screenshots; the model sees them at half size (112x224 = 128 patches of 14x14,
    # 32 image tokens after the 2x2 merge), which keeps the vision tower cheap on a CPU.
    c.model.min_pixels = 112 * 224
    c.model.max_pixels = 112 * 224

    # ------------------------------------------------------------------ sequence buckets
    c.buckets = ml_collections.ConfigDict()
    c.buckets.tokens = (192, 256, 320, 384)
    c.buckets.patches = (128,)  # per image; a batch of B images uses B x this
    c.buckets.max_turn_tokens = (64, 36, 10, 22)  # per CoaT turn (end token included): description, thought,
    # action, grounding -- about the longest golden turns of the synthetic data (a box is ~20 tokens: one per digit)
    # a length over the largest bucket (SFT tokens, patches, sampler prefix / prompts, a bound of the T-DPO rows),
    # measured before training, adds a bucket for it (the `buckets` stage); True stops the job there instead
    c.buckets.fixed = False

    # ------------------------------------------------------------------ warm-up SFT
    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 900
    c.sft.batch_size = 8
    c.sft.micro_batch_size = 4  # gradient accumulation over micro-batches (the ViT attends over a whole one)
    c.sft.learning_rate = 2e-3
    c.sft.warmup_steps = 30
    c.sft.schedule = "cosine"
    c.sft.weight_decay = 0.01
    c.sft.grad_clip = 1.0
    c.sft.checkpoint_every = 100
    c.sft.seed_candidates = 2  # checkpoints (the last N saved) scored for seed selection
    c.sft.freeze_vision = False  # the paper trains the ViT during warm-up SFT
    c.sft.lora_rank = 0  # 0: full fine-tuning; > 0: LoRA adapters of this rank (alpha = 2 x rank)

    # ------------------------------------------------------------------ seed selection (docs/method.md §9)
    c.seed_selection = ml_collections.ConfigDict()
    c.seed_selection.steps = 24  # training steps whose trees score each candidate
    c.seed_selection.diversity_weight = 0.1  # score = Acc_S + w * Div_R / max_candidates(Div_R)
    c.seed_selection.embedder = "auto"  # auto | minilm | tfidf (auto: MiniLM when installed, else TF-IDF)

    # ------------------------------------------------------------------ CoaT-tree sampling
    c.sampler = ml_collections.ConfigDict()
    c.sampler.branching = (3, 3, 3, 1)
    c.sampler.temperature = 1.0
    c.sampler.top_k = 0
    c.sampler.top_p = 1.0
    c.sampler.batch_size = 4  # trees per jitted call (4 x 27 leaves)
    c.sampler.prefix_buckets = (96, 128, 192, 256)  # screenshot + first prompt
    c.sampler.prompt_buckets = (32, 64, 128, 192)  # the turn-2..4 prompts (turn 2 holds the history)

    # ------------------------------------------------------------------ rewards / values
    c.reward = ml_collections.ConfigDict()
    c.reward.v_type = 0.1
    c.reward.v_format = 0.1
    c.reward.discount = 0.95

    # ------------------------------------------------------------------ IPL rounds (T-DPO)
    c.ipl = ml_collections.ConfigDict()
    c.ipl.rounds = 2
    c.ipl.steps_per_round = 64  # training steps (screens) whose trees are sampled each round (0: all)
    c.ipl.round_fraction = 0.0  # > 0: sample this share of the training steps each round instead
    # tdpo | naive_dpo | no_negatives | continued_sft (the control: golden CoaT, same updates) | the other seeds'
    # learners at the same budget of sampled completions (pipeline/configs.py): grpo (UI-R1) | ppo | gigppo
    # (online, dense)
    c.ipl.method = "tdpo"
    c.ipl.loss_kind = "sigmoid"  # sigmoid | ipo | hinge
    c.ipl.beta = 0.1
    c.ipl.sft_weight = 1.0
    c.ipl.sft_norm = "token"  # the SFT term's NLL: per token, or "sum" over the turn like the DPO log-probs
    # round 1: with the pairs below the least harmful rate tried (2e-4 wrecked the seed's grounding turn)
    c.ipl.learning_rate = 5e-6
    c.ipl.later_learning_rate = 0.0  # rounds 2.. (0: same as round 1; the paper: 1e-6 then a constant 1e-7)
    c.ipl.schedule = "constant"  # constant | cosine (over the round's updates), after `warmup_steps` linear warm-up
    c.ipl.warmup_steps = 0
    c.ipl.lora_rank = 0  # 0: full weights; > 0: LoRA adapters (e.g. a 2B/7B model on one GPU)
    c.ipl.batch_size = 8  # packed rows (prefix nodes) per T-DPO step
    c.ipl.max_pairs_per_batch = 16
    c.ipl.text_buckets = (384, 512, 640)  # packed row lengths (prefix + continuations)
    c.ipl.max_pairs_per_tree = 12  # β pairs per (tree, turn)
    c.ipl.max_gamma_pairs_per_tree = 0  # γ pairs per (tree, turn); 0: max_pairs_per_tree
    # γ pairs (golden ↑ vs sampled ↓ in trees without a correct leaf): "paper" (action turn and grounding),
    # "consistent" (action-turn pairs only below thoughts that name the golden action), "grounding", "none"
    c.ipl.gamma_pairs = "consistent"  # measured: "paper" taught the action turn to contradict its own thought
    c.ipl.pair_turns = (1, 2, 3, 4)  # CoaT turns that give pairs ((3, 4): action and grounding only, an ablation)
    c.ipl.dedup = True  # drop exact duplicate pairs (same prefix, positive and negative tokens)
    c.ipl.type_balance = 0.0  # > 0: each positive action type keeps <= ceil(x * median type count) pairs a round
    c.ipl.mix_trees = True  # pack the round's prefix groups in a seeded random order (batches mix trees)
    c.ipl.freeze_vision = True
    c.ipl.early_stop = True
    # What each round did (results.json "diagnostics", the round and ablation tables): preference accuracy and margins
    # on the round's pairs and on pairs from trees on `heldout_steps` dev steps (0: none), before and after the
    # update; sampled pass@1, greedy accuracy and thought -> action consistency on `diagnostic_steps` of the round's
    # steps (costs one more tree sampling of those steps and greedy decoding of them twice)
    c.ipl.diagnostics = True
    c.ipl.diagnostic_steps = 16
    c.ipl.heldout_steps = 16

    # ------------------------------------------------------------------ RL baselines (ipl.method = grpo|ppo|gigppo)
    c.rl = rl_section()  # every field documented in configs/sections.py; the budget rule in pipeline/configs.py

    # ------------------------------------------------------------------ evaluation
    c.eval = ml_collections.ConfigDict()
    c.eval.batch_size = 8
    c.eval.max_steps = 0  # 0 = every step of each split
    c.eval.every_round = True  # False: only the last round is evaluated on the test splits (the others: dev only)
    # splits also evaluated with every screenshot replaced by a grey image (how much accuracy needs the screen)
    c.eval.blank_splits = ("test",)
    # online evaluation (eval/online.py): the policy acts greedily in the live world on the first N episodes of
    # each of `online_splits` (their world seeds and tasks: seen tasks in `test`, unseen ones in `test_task_unseen`);
    # episode success rate and mean steps go into results.json (`online`: the first split, `online_splits`: each)
    c.eval.online_episodes = 40  # 0: off
    c.eval.online_splits = ("test", "test_task_unseen")
    c.eval.online_max_steps = 25  # step limit: min(this, 2 x the expert's steps); a cut episode is a failure

    # ------------------------------------------------------------------ final export
    c.export = ml_collections.ConfigDict()
    c.export.viewer_steps = 4  # training steps whose sampled trees go into the HTML viewer

    # ------------------------------------------------------------------ ablation (`ipl-jax ablate`)
    c.ablation = ml_collections.ConfigDict()
    c.ablation.variants = ("tdpo", "naive_dpo", "no_negatives", "no_evolution", "k2", "k3", "k4")
    c.ablation.rounds = 1  # IPL rounds per variant (the paper's ablation is on round 1)

    # ------------------------------------------------------------------ mesh (axis sizes; -1 = the rest)
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1

    if arg in (None, "", "default", "scarce"):  # "scarce": the name this setting had before it became the default
        scarce(c)
    elif arg == "quick":
        scarce(c)
        quick(c)
    elif arg == "gpu":
        gpu(c)
    elif arg != "full":
        raise ValueError(
            f"configs/synthetic.py: unknown variant {arg!r} (expected nothing, quick, full, scarce or gpu)"
        )
    return c


def quick(c):
    """The smallest end-to-end run of the default's path (tests, the notebook): every stage, a few steps each,
    warm-up SFT on 6 annotated episodes and the round on 18 action-only ones."""
    c.data.annotated_episodes, c.data.action_episodes = 6, 18
    c.data.train_episodes, c.data.dev_episodes, c.data.test_episodes = 24, 4, 4
    c.evolution.max_items = 48
    c.model.num_hidden_layers = 2
    c.model.vocab_size = 1024
    # one shape per program: nothing compiles twice
    c.buckets.tokens = (384,)
    c.sampler.prefix_buckets = (128,)
    c.sampler.prompt_buckets = (128,)
    c.ipl.text_buckets = (640,)
    c.sft.steps, c.sft.batch_size, c.sft.micro_batch_size, c.sft.checkpoint_every = 8, 4, 4, 4
    c.sft.warmup_steps, c.sft.seed_candidates = 2, 2
    c.seed_selection.steps, c.seed_selection.embedder = 4, "tfidf"
    c.sampler.branching, c.sampler.batch_size = (2, 2, 2, 1), 4
    c.ipl.rounds, c.ipl.steps_per_round, c.ipl.batch_size = 1, 4, 4
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
    c.ipl.type_balance = 0.0  # 4 steps a round: keep every pair so that the round has updates


def scarce(c):
    """Scarce annotations, the setting IPL's rule reward is made for: warm-up SFT on the golden CoaT of N
    episodes; the rounds sample trees on M >> N further episodes read as action logs (golden action only), which
    supervised training cannot use. ``ipl-jax ablate`` compares, from one seed at one sample budget, T-DPO with
    rejection sampling (``no_negatives``), naive DPO, more SFT on the N annotated episodes (``continued_sft``)
    and SFT on the hidden CoaT of the M episodes (``sft_oracle``, an upper bound). N, M, the rounds and the
    round's optimizer are fields (data.annotated_episodes / action_episodes, ipl.rounds, ipl.learning_rate,
    ipl.schedule, ...); one round at lr 1e-4 (the best of 2e-5 / 1e-4 / 3e-4 for T-DPO on seed 0) with its pairs
    balanced over action types (ipl.type_balance = 1: without it the rounds trade PRESS steps for CLICK; README),
    about 20 minutes per seed of that ablation on two cores: one base SFT, intermediate rounds (with ipl.rounds >
    1) evaluated on dev only, no live-world episodes and no blank-screen control."""
    c.data.annotated_episodes, c.data.action_episodes = 30, 270
    c.data.train_episodes = 300
    c.sft.steps, c.sft.checkpoint_every, c.sft.seed_candidates = 600, 100, 1
    c.seed_selection.steps = 8
    c.ipl.rounds = c.ablation.rounds = 1
    c.ipl.steps_per_round = 48
    c.ipl.learning_rate = 1e-4
    c.ipl.type_balance = 1.0
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
    estimate from the programs' FLOPs and compilations (README), not yet measured."""
    c.model.hidden_size, c.model.intermediate_size, c.model.num_hidden_layers = 512, 1536, 8
    c.model.num_attention_heads, c.model.num_key_value_heads = 8, 4
    c.model.vision_depth, c.model.vision_embed_dim, c.model.vision_num_heads = 4, 256, 4
    c.model.dtype = "bfloat16"
    c.model.min_pixels = c.model.max_pixels = 224 * 448
    c.data.loader_threads = 8
    c.buckets.patches = (512,)
    c.buckets.tokens = (480,)  # the longest dialogue of the default's 384 bucket + 96 more image tokens
    c.sampler.prefix_buckets = (192,)  # system + image + turn-1 prompt: 161 tokens
    c.sampler.prompt_buckets = (192,)
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
