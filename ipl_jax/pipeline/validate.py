"""Checks that run before any expensive work: the job config's values, and the paths a command is given.

Every check raises ``UsageError`` with one line that names what is wrong (the config field, the flag, the file)
and what to do. The job calls ``validate_config`` before its workdir is created or its config recorded, so a
rejected invocation leaves nothing behind and the same workdir resumes once the mistake is fixed. The commands
call the path checks (``input_file``, ``output_file``, ``model_dir``, ...) on their flags before loading a model
or reading a dataset.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import ml_collections

PUBLISHED = ("aitz", "amex", "androidcontrol")  # the benchmarks' own layouts (paper configs use them)
TFDS_PREFIX = "tfds:"  # data.format "tfds:NAME": a prepared TensorFlow Datasets dataset
MAX_SEED = 2**32 - 1  # numpy's seed range (the world and the samplers take numpy seeds)


class UsageError(ValueError):
    """An invocation that cannot work as given: a bad config value or flag, a missing or wrong kind of path, an
    output that cannot be written. The message is one line naming the field / flag / file and what to do."""


# --------------------------------------------------------------------------------------------- paths


def input_file(path: str | os.PathLike, flag: str, what: str = "a file") -> Path:
    """``path`` as an existing regular file."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {p}: is a directory, expected {what}")
    if not p.is_file():
        raise UsageError(f"{flag} {p}: no such file (expected {what})")
    return p


def input_dir(path: str | os.PathLike, flag: str, what: str = "a directory") -> Path:
    """``path`` as an existing directory."""
    p = Path(path)
    if p.is_file():
        raise UsageError(f"{flag} {p}: is a file, expected {what}")
    if not p.is_dir():
        raise UsageError(f"{flag} {p}: no such directory (expected {what})")
    return p


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _creatable(directory: Path, flag: str, shown: Path) -> None:
    """``directory`` exists or can be made, and is writable; errors name ``shown`` (the flag's value)."""
    base = _nearest_existing(directory)
    if not base.is_dir():
        raise UsageError(f"{flag} {shown}: cannot be created because {base} is a file; choose another path")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown}: {base} is not writable; choose a writable location")


def output_dir(path: str | os.PathLike, flag: str) -> Path:
    """A directory that exists or can be created, and can be written into (nothing is created here)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {p}: exists and is not a directory; choose a directory path")
    _creatable(p, flag, p)
    return p


def output_file(path: str | os.PathLike, flag: str) -> Path:
    """A file path that can be written (its directory exists or can be created); checked before the work so that
    a bad path does not throw the work away."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {p}: is a directory; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {p}: is not writable; choose another file")
    _creatable(p.parent, flag, p)
    return p


def model_dir(path: str | os.PathLike, flag: str) -> Path:
    """A Hugging Face model directory: ``config.json`` that parses and safetensors weights whose headers read.

    Only the headers are read (the files are memory-mapped), so this is cheap even for a 7B checkpoint."""
    p = input_dir(path, flag, "a Hugging Face model directory")
    config = p / "config.json"
    if not config.is_file():
        raise UsageError(f"{flag} {p}: no config.json; expected a Hugging Face model directory")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {config}: not valid JSON ({e}); re-download or re-export the model") from None
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise UsageError(f"{flag} {p}: no *.safetensors weights; expected a Hugging Face model directory")
    for w in weights:
        check_safetensors(w, flag)
    return p


def check_safetensors(path: Path, flag: str) -> None:
    """Raise ``UsageError`` when ``path`` is not a readable safetensors file (truncated, corrupt header)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
    except Exception as e:  # safetensors raises its own error type (and OSError) for a broken file
        reason = " ".join(str(e).split()) or type(e).__name__
        raise UsageError(
            f"{flag} {path}: not a valid safetensors file ({reason}); re-download or re-export the model"
        ) from None
    if not names:
        raise UsageError(f"{flag} {path}: a safetensors file without tensors; re-download or re-export the model")


# -------------------------------------------------------------------------------------------- config


def _field(config: ml_collections.ConfigDict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def _bad(field: str, value, why: str) -> UsageError:
    return UsageError(f"config.{field}={value!r}: {why} (fix it with --config.{field}=...)")


def _check(config, field: str, ok, why: str) -> None:
    try:
        value = _field(config, field)
    except (KeyError, AttributeError):
        return  # a config without this section (another job kind) is not checked here
    try:
        good = ok(value)
    except (TypeError, ValueError):
        good = False
    if not good:
        raise _bad(field, value, why)


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _nonneg_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _nonneg(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def validate_config(config: ml_collections.ConfigDict, n_devices: int | None = None) -> None:
    """Check a job config's values, its dataset and its starting checkpoint before any stage runs.

    n_devices: the devices the mesh spans (default: ``jax.device_count()``). Raises ``UsageError``.
    """
    from ipl_jax.eval.seed_selection import EMBEDDERS
    from ipl_jax.training.optimizer import SCHEDULES

    _check(config, "seed", lambda v: _nonneg_int(v) and v <= MAX_SEED, f"must be an integer in [0, {MAX_SEED}]")
    _check_data(config)
    _check_sources(config)
    _check(config, "sft.steps", _nonneg_int, "must be >= 0")
    _check(config, "sft.batch_size", _positive_int, "must be >= 1")
    _check(config, "sft.micro_batch_size", _nonneg_int, "must be >= 0 (0: no micro-batches)")
    _check(
        config, "sft.micro_batch_size", lambda m: m == 0 or config.sft.batch_size % m == 0, "must divide sft.batch_size"
    )
    _check(config, "sft.learning_rate", _positive, "must be > 0")
    _check(config, "sft.warmup_steps", _nonneg_int, "must be >= 0")
    _check(config, "sft.weight_decay", _nonneg, "must be >= 0")
    _check(config, "sft.grad_clip", _nonneg, "must be >= 0 (0: no clipping)")
    _check(config, "sft.checkpoint_every", _positive_int, "must be >= 1")
    _check(config, "sft.seed_candidates", _positive_int, "must be >= 1")
    _check(config, "sft.schedule", lambda v: v in SCHEDULES, f"must be one of {', '.join(SCHEDULES)}")
    _check(config, "seed_selection.steps", _positive_int, "must be >= 1")
    _check(config, "seed_selection.embedder", lambda v: v in EMBEDDERS, f"must be one of {', '.join(EMBEDDERS)}")
    _check(
        config,
        "sampler.branching",
        lambda b: len(b) == 4 and all(_positive_int(x) for x in b),
        "must be four integers >= 1 (children per node at each CoaT turn)",
    )
    _check(config, "sampler.temperature", _nonneg, "must be >= 0")
    _check(config, "sampler.top_p", lambda v: _positive(v) and v <= 1, "must be in (0, 1]")
    _check(config, "sampler.top_k", _nonneg_int, "must be >= 0 (0: off)")
    _check(config, "sampler.batch_size", _positive_int, "must be >= 1")
    _check(config, "reward.discount", lambda v: _positive(v) and v <= 1, "must be in (0, 1]")
    _check(config, "eval.batch_size", _positive_int, "must be >= 1")
    _check(config, "eval.max_steps", _nonneg_int, "must be >= 0 (0: every step)")
    _check_model(config)
    _check_ipl(config)
    _check_online(config)
    _check_rl(config)
    _check_mesh(config, n_devices)


def known_format(fmt: str) -> bool:
    """The synthetic world, a format ``data.datasets`` reads, or ``tfds:NAME``."""
    from ipl_jax.data.datasets import LOADERS

    return fmt == "synthetic" or fmt in LOADERS or fmt.startswith(TFDS_PREFIX)


def _check_data(config) -> None:
    from ipl_jax.data.datasets import LOADERS

    _check(config, "data.format", known_format, f"must be one of synthetic, {', '.join(LOADERS)} or {TFDS_PREFIX}NAME")
    for f in ("train_episodes", "test_episodes"):
        _check(config, f"data.{f}", _positive_int, "must be >= 1")
    _check(config, "data.dev_episodes", _nonneg_int, "must be >= 0")
    _check(config, "data.png_level", lambda v: _nonneg_int(v) and v <= 9, "must be a PNG compression level 0..9")
    _check(config, "data.test_splits", lambda v: len(v) >= 1, "must name at least one test split")
    _check(config, "data.store", lambda v: v in ("aitz", "arrayrecord"), "must be aitz or arrayrecord")
    _check(config, "data.shards", _positive_int, "must be >= 1")
    _check_scarce(config)


def _check_scarce(config) -> None:
    """Scarce annotations: N >= 1 annotated and M action-only episodes that fit the synthetic world's training
    split (a real dataset's is counted when it is read); ``sft_oracle`` needs action-only episodes to read."""
    for f in ("annotated_episodes", "action_episodes"):
        _check(config, f"data.{f}", _nonneg_int, "must be an integer >= 0")
    try:
        n, m, fmt = int(config.data.annotated_episodes), int(config.data.action_episodes), str(config.data.format)
        method = str(config.ipl.method)
    except (KeyError, AttributeError):
        return
    if m > 0 and n < 1:
        raise _bad(
            "data.annotated_episodes", n, f"leaves no annotated episode for warm-up SFT beside the {m} action-only ones"
        )
    if m > 0 and fmt == "synthetic":
        pool = int(config.data.train_episodes) - (0 if config.data.dev_split else int(config.data.dev_holdout))
        if n + m > pool:
            raise _bad(
                "data.action_episodes",
                m,
                f"with {n} annotated episodes exceeds the {pool} training episodes (raise data.train_episodes)",
            )
    if method == "sft_oracle" and m == 0:
        raise _bad(
            "ipl.method",
            method,
            "trains on the CoaT of action-only episodes, and data.action_episodes is 0 (without them "
            "continued_sft already trains on the golden CoaT of the round's steps)",
        )


def _check_sources(config) -> None:
    """A job on a published benchmark needs its dataset directory and a starting checkpoint (a fresh model of the
    config's tiny size is meant for the synthetic world only); a packed dataset needs its directory."""
    try:
        data, checkpoint = config.data, str(config.model.checkpoint)
    except (KeyError, AttributeError):
        return
    fmt, root = str(data.format), str(data.root)
    if fmt in PUBLISHED and not root and not checkpoint:
        raise UsageError(
            f"config.data.root and config.model.checkpoint are empty: a job on {fmt} data reads its "
            f"dataset from disk and starts from a Hugging Face checkpoint; pass --config.data.root=DIR "
            f"--config.model.checkpoint=DIR (see README: Datasets)"
        )
    if fmt in PUBLISHED and not checkpoint:
        raise UsageError(
            f"config.model.checkpoint is empty: a job on {fmt} data starts from a Hugging Face "
            f"checkpoint; pass --config.model.checkpoint=DIR (e.g. a local Qwen2-VL-7B-Instruct "
            f"download)"
        )
    if fmt != "synthetic" and not fmt.startswith(TFDS_PREFIX):
        _check_root(data, fmt, root)
    if checkpoint:
        model_dir(checkpoint, "config.model.checkpoint")


def _packed(p: Path) -> bool:
    """A directory written by ``ipl-jax pack-data`` (its readers recognise it whatever ``data.format`` says)."""
    try:
        from ipl_jax.data.packed.layout import is_packed
    except ImportError:
        return False
    return bool(is_packed(p))


def _check_root(data, fmt: str, root: str) -> None:
    if not root:
        raise UsageError(
            f"config.data.root is empty: the {fmt} job reads its dataset from disk; pass "
            f"--config.data.root=DIR (see README: Datasets)"
        )
    p = Path(root)
    if not p.is_dir():
        raise UsageError(
            f"config.data.root={root!r}: no such directory; pass --config.data.root=DIR holding the "
            f"{fmt} dataset (see README: Datasets)"
        )
    if fmt not in PUBLISHED or _packed(p):
        return
    if fmt == "aitz":
        splits = ["train"] + ([data.dev_split] if data.dev_split else []) + list(data.test_splits)
        missing = [s for s in dict.fromkeys(splits) if not (p / s).is_dir()]
        if missing:
            raise UsageError(
                f"config.data.root={root!r}: no split folder {', '.join(missing)} (AITZ layout: "
                f"ROOT/<split>/<subset>/<episode>/; see README: Datasets)"
            )
    elif fmt == "amex" and not (p / "instruction_anno").is_dir():
        raise UsageError(f"config.data.root={root!r}: no instruction_anno/ folder (AMEX layout; see README: Datasets)")
    elif fmt == "androidcontrol" and not (p / "splits.json").is_file():
        raise UsageError(f"config.data.root={root!r}: no splits.json (AndroidControl layout; see README: Datasets)")


def _check_ipl(config) -> None:
    if "ipl" not in config:
        return
    from ipl_jax.pipeline.round_settings import ipl_settings

    try:
        ipl_settings(config)
    except ValueError as e:
        msg = str(e)
        field = msg.split(":", 1)[0].removeprefix("config.") if msg.startswith("config.ipl.") else ""
        hint = f" (fix it with --config.{field}=...)" if field else ""
        raise UsageError(msg + hint) from None
    except (KeyError, AttributeError) as e:
        raise UsageError(f"config.ipl: {e}") from None


def _check_online(config) -> None:
    from ipl_jax.data.synthetic.dataset import SPLITS

    _check(config, "eval.online_episodes", _nonneg_int, "must be >= 0 (0: no online evaluation)")
    _check(config, "eval.online_max_steps", _positive_int, "must be >= 1")
    _check(config, "eval.online_split", lambda v: v in SPLITS, f"must be one of {', '.join(SPLITS)}")
    try:
        on, fmt = int(config.eval.online_episodes) > 0, str(config.data.format)
    except (KeyError, AttributeError):
        return
    if on and fmt != "synthetic":
        raise UsageError(
            f"config.eval.online_episodes={config.eval.online_episodes}: online evaluation plays the synthetic "
            f"world, but config.data.format is {fmt!r} (fix it with --config.eval.online_episodes=0)"
        )


def _check_rl(config) -> None:
    """The ``rl`` section (``rl/section.py``), and what a GRPO / PPO / GiGPPO round needs from the rest."""
    from ipl_jax.pipeline.rounds import RL_METHODS
    from ipl_jax.rl.rewards import STYLES
    from ipl_jax.rl.rollout import STEP_REWARDS

    unit = lambda v: _nonneg(v) and v <= 1  # noqa: E731
    for f in ("group_size", "prompts_per_batch", "updates_per_batch"):
        _check(config, f"rl.grpo.{f}", _positive_int, "must be >= 1")
    _check(config, "rl.grpo.style", lambda v: v in STYLES, f"must be one of {', '.join(STYLES)}")
    _check(config, "rl.grpo.length_norm", lambda v: v in ("sequence", "token"), "must be sequence or token")
    _check(config, "rl.grpo.dast", lambda v: isinstance(v, bool), "must be True or False")
    for f in ("clip_eps", "learning_rate"):
        _check(config, f"rl.grpo.{f}", _positive, "must be > 0")
    _check(config, "rl.grpo.kl_beta", _nonneg, "must be >= 0")
    for f in ("gamma_dense", "lam"):
        _check(config, f"rl.ppo.{f}", unit, "must be in [0, 1]")
    for f in ("kl_coef", "success_reward"):
        _check(config, f"rl.ppo.{f}", _nonneg, "must be >= 0")
    for f in ("value_clip", "policy_learning_rate", "critic_learning_rate", "step_factor"):
        _check(config, f"rl.ppo.{f}", _positive, "must be > 0")
    _check(config, "rl.ppo.critic_warmup", _nonneg_int, "must be >= 0")
    for f in ("policy_updates", "tasks_per_batch", "trajectories_per_task", "minibatch_rows", "max_steps"):
        _check(config, f"rl.ppo.{f}", _positive_int, "must be >= 1")
    _check(config, "rl.ppo.step_reward", lambda v: v in STEP_REWARDS, f"must be one of {', '.join(STEP_REWARDS)}")
    _check(
        config,
        "rl.row_buckets",
        lambda v: len(v) >= 1 and all(_positive_int(x) for x in v),
        "must be one or more lengths >= 1 (training rows: prompt + sampled CoaT)",
    )
    try:
        method = str(config.ipl.method)
    except (KeyError, AttributeError):
        return
    if method not in RL_METHODS:
        return
    if "rl" not in config:
        raise UsageError(f"config.ipl.method={method!r}: the config has no rl section (see rl/section.py)")
    _check(config, "ipl.lora_rank", lambda v: v == 0, f"must be 0 with ipl.method={method} (full weights)")
    if method != "grpo":
        _check(
            config, "data.format", lambda v: v == "synthetic", f"must be synthetic with ipl.method={method} (online)"
        )
    if method == "gigppo":
        _check(config, "rl.ppo.trajectories_per_task", lambda v: v >= 2, "must be >= 2 with gigppo (sibling states)")


_BACKEND_DTYPES = {"tpu": ("float32", "bfloat16")}  # others: float32, bfloat16, float16


def _check_model(config, platform: str | None = None) -> None:
    """model.dtype / param_dtype / attention / remat: known names the backend can run."""
    if "model" not in config:
        return
    from ipl_jax.model.layers import ATTENTION_IMPLS, REMAT_POLICIES, check_remat
    from ipl_jax.pipeline.model_stage import DTYPE_CHOICES

    if platform is None:
        import jax

        platform = jax.default_backend()
    valid = ("auto",) + _BACKEND_DTYPES.get(platform, DTYPE_CHOICES[1:])
    for field in ("model.dtype", "model.param_dtype"):
        _check(
            config, field, lambda v: v in valid, f"unknown or not available on {platform} (valid: {', '.join(valid)})"
        )
    _check(config, "model.attention", lambda v: v in ATTENTION_IMPLS, f"must be one of {', '.join(ATTENTION_IMPLS)}")
    _check(
        config,
        "model.attention",
        lambda v: v != "cudnn" or platform == "gpu",
        f"cuDNN attention needs a GPU, this backend is {platform} (valid here: auto, reference, xla)",
    )
    _check(
        config,
        "model.attention",
        lambda v: v != "cudnn" or config.model.get("dtype", "auto") in ("auto", "bfloat16", "float16"),
        f"cuDNN attention needs model.dtype bfloat16 or float16, not {config.model.get('dtype')} (or use auto)",
    )
    _check(config, "model.remat", lambda v: v in REMAT_POLICIES, f"must be one of {', '.join(REMAT_POLICIES)}")
    try:
        check_remat(config.model.get("remat", "none"), platform, "config.model.remat")
    except ValueError as e:
        raise UsageError(f"{e} (fix it with --config.model.remat=...)") from None


def batch_axis_size(config, n_devices: int) -> int:
    """How many ways the mesh splits a batch: the size of its ``data`` x ``fsdp`` axes on ``n_devices``."""
    shape = [int(config.mesh.data), int(config.mesh.fsdp), int(config.mesh.tensor)]
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise UsageError(
            f"config.mesh (data, fsdp, tensor) = {tuple(shape)}: sizes must be >= 1, with at most one "
            f"-1 (all remaining devices)"
        )
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = n_devices // known if n_devices % known == 0 else 0
    if math.prod(shape) != n_devices:
        raise UsageError(
            f"config.mesh (data, fsdp, tensor) = ({config.mesh.data}, {config.mesh.fsdp}, "
            f"{config.mesh.tensor}) does not fit {n_devices} devices; set --config.mesh.data etc. so "
            f"that their product is {n_devices}"
        )
    return shape[0] * shape[1]


def _check_mesh(config, n_devices: int | None) -> None:
    if "mesh" not in config:
        return
    if n_devices is None:
        import jax

        n_devices = jax.device_count()
    if n_devices <= 1:
        return  # one device: the job runs without a mesh
    ways = batch_axis_size(config, n_devices)
    micro = int(config.sft.micro_batch_size)
    batches = {
        ("sft.micro_batch_size" if micro else "sft.batch_size"): micro or int(config.sft.batch_size),
        "sampler.batch_size": int(config.sampler.batch_size),
        "ipl.batch_size": int(config.ipl.batch_size),
        "eval.batch_size": int(config.eval.batch_size),
    }
    for field, size in batches.items():
        if size % ways:
            raise UsageError(
                f"config.{field}={size}: not divisible by the mesh's batch axes (data x fsdp = {ways} "
                f"on {n_devices} devices), so every device would hold the whole batch; use a multiple "
                f"of {ways}"
            )
