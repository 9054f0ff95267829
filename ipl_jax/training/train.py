"""Training machinery: TrainState, the optimizer, the jitted step builder, the SFT loss and the training loop.

The pieces, each a pure function over pytrees:

* ``TrainState`` — step, trainable params, frozen params, optimizer state, RNG key (a flax.struct dataclass).
  What is trainable is decided once, by ``create_train_state``: full fine-tuning (everything trainable), a frozen
  subset (e.g. the vision tower: those leaves move to ``frozen``, get no gradient and no optimizer state, so
  they can never change), or LoRA (all base weights frozen, ``params`` is a ``lora.LoraParams``).
  ``model_params(state.params, state.frozen)`` rebuilds the full parameter tree the model reads.
* ``make_optimizer(config)`` — AdamW with linear warm-up then cosine decay (or constant), global-norm clipping,
  weight decay masked off norms and biases. Gradient accumulation is NOT an optax wrapper: the step scans over
  micro-batches (``grad_accum_steps``) and applies one update, so the loss is exactly the token-weighted mean over
  the whole batch and no accumulator lives in the optimizer state.
* ``make_train_step(loss_fn, optimizer, ...)`` — the generic step ``(state, batch) -> (state, metrics)``, jitted
  once per batch shape with the state donated, optionally under a mesh with explicit in/out shardings.
  ``loss_fn(params, batch, rng) -> (loss, metrics)`` returns a mean loss; ``metrics[weight_key]`` (e.g. the
  number of loss tokens) weights the micro-batches when accumulating.
* ``sft_loss`` / ``make_sft_loss`` — masked next-token cross-entropy on assistant-turn tokens (any logits_fn).
* Qwen2-VL SFT: ``sft_model_batch(cfg, TrainingBatch)`` (host: collated dialogue batch -> ids, masks, M-RoPE
  positions, padded vision inputs), ``make_qwen2vl_sft_step(cfg, optimizer, schedule, ...)`` (the loss reads
  log-probs from hidden states in chunks, never the full logits), ``sft_batch_shardings`` for a mesh.
* ``train_loop`` — runs steps, stops with ``NonFiniteLossError`` on a NaN/inf loss or gradient norm before any
  checkpoint is written, and saves through ``checkpoint.Checkpointer``.

With ``grad_accum_steps = A > 1`` every batch leaf carries a leading micro-batch axis ``[A, ...]`` (each
micro-batch is itself a fixed-shape batch, including its own padded image patches); ``stack_microbatches`` builds
that from A batches.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import struct

from ipl_jax.training.lora import LoraConfig, LoraParams, apply_lora, flatten_with_paths, init_lora, path_str

# Path components containing 'norm' or 'bias', named 'scale' or starting with 'ln_' (layer norms, RMS norms,
# biases) get no weight decay.
NO_DECAY_REGEX = r"(^|/)([^/]*(norm|bias)[^/]*|scale|ln_[^/]*)(/|$)"
VISION_REGEX = r"^visual/"


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf loss or gradient norm; nothing from that step was checkpointed."""


# ------------------------------------------------------------------------------------------------ config


def default_train_config() -> ml_collections.ConfigDict:
    """Defaults for the optimizer / LoRA / precision / checkpoint sections (method.md §7 for the paper's values)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_steps = 100

    c.optimizer = o = ml_collections.ConfigDict()
    o.learning_rate = 1e-5  # paper SFT: 3e-6 .. 3e-5; IPL: 1e-6 .. 1e-7
    o.schedule = "cosine"  # "cosine" (decays to end_lr_ratio·lr at total_steps) or "constant"
    o.warmup_steps = 0
    o.total_steps = 100  # optimizer updates the schedule spans (warm-up included)
    o.end_lr_ratio = 0.0
    o.b1 = 0.9
    o.b2 = 0.999
    o.eps = 1e-8
    o.weight_decay = 0.0
    o.no_decay_regex = NO_DECAY_REGEX
    o.grad_clip_norm = 1.0  # <= 0 disables clipping
    o.grad_accum_steps = 1

    c.freeze_vision = False  # paper: ViT trainable in SFT, optionally frozen in IPL
    c.freeze_regex = VISION_REGEX

    c.lora = lo = ml_collections.ConfigDict()
    lo.enabled = False
    lo.rank = 128  # paper's warm-up SFT rank
    lo.alpha = 256.0
    lo.targets = LoraConfig().targets

    c.compute_dtype = "float32"  # "bfloat16": params cast to bf16 inside the step; master weights stay fp32
    c.frozen_dtype = "float32"  # storage dtype of frozen (LoRA base / frozen tower) params

    c.checkpoint = ck = ml_collections.ConfigDict()
    ck.directory = ""
    ck.save_every = 100
    ck.keep = 3
    ck.async_save = True
    return c


def lora_config_from(config: ml_collections.ConfigDict) -> LoraConfig | None:
    """LoraConfig from the ``lora`` section, or None when LoRA is disabled."""
    if not config.lora.enabled:
        return None
    return LoraConfig(rank=int(config.lora.rank), alpha=float(config.lora.alpha), targets=tuple(config.lora.targets))


# --------------------------------------------------------------------------------------------- optimizer


# Other names a config section may use for the same setting (e.g. configs/synthetic.py's ``sft`` section).
_OPTIMIZER_ALIASES = {"total_steps": ("steps",), "grad_clip_norm": ("grad_clip",)}


def optimizer_settings(section) -> ml_collections.ConfigDict:
    """The optimizer fields of ``section`` (any mapping / ConfigDict), missing ones filled from the defaults.

    Accepts ``steps`` for total_steps and ``grad_clip`` for grad_clip_norm, so a job section such as
    ``config.sft`` can be passed as it is. Unrelated fields of the section are ignored.
    """
    out = default_train_config().optimizer
    for name in list(out.keys()):
        for key in (name, *_OPTIMIZER_ALIASES.get(name, ())):
            if key in section:
                value = section[key]
                out[name] = type(out[name])(value) if not isinstance(out[name], str) else str(value)
                break
    return out


def make_schedule(config) -> optax.Schedule:
    """Learning rate per optimizer update: linear warm-up from 0, then cosine decay or constant.

    ``config``: the ``optimizer`` section (learning_rate, schedule, warmup_steps, total_steps, end_lr_ratio).
    """
    config = optimizer_settings(config)
    lr, warmup = float(config.learning_rate), int(config.warmup_steps)
    if config.schedule == "cosine":
        total = max(int(config.total_steps), warmup + 1)
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total, lr * float(config.end_lr_ratio))
    if config.schedule == "constant":
        if warmup == 0:
            return optax.constant_schedule(lr)
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])
    raise ValueError(f"optimizer.schedule: unknown schedule {config.schedule!r} (expected 'cosine' or 'constant')")


def decay_mask(params, no_decay_regex: str = NO_DECAY_REGEX):
    """bool tree: True where weight decay applies (kernels, embeddings; not norms, norm scales or biases)."""
    regex = re.compile(no_decay_regex)
    return jax.tree_util.tree_map_with_path(lambda p, _: not regex.search(path_str(p)), params)


def make_optimizer(config) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW on the schedule, weight decay masked by ``no_decay_regex``.

    ``config``: the ``optimizer`` section (see ``optimizer_settings``). Gradient accumulation happens in the step
    (see module docstring).
    """
    config = optimizer_settings(config)
    parts = []
    if float(config.grad_clip_norm) > 0:
        parts.append(optax.clip_by_global_norm(float(config.grad_clip_norm)))
    regex = config.no_decay_regex
    parts.append(
        optax.adamw(
            make_schedule(config),
            b1=float(config.b1),
            b2=float(config.b2),
            eps=float(config.eps),
            weight_decay=float(config.weight_decay),
            mask=lambda params: decay_mask(params, regex),
        )
    )
    return optax.chain(*parts)


# ------------------------------------------------------------------------------------------------ state


@struct.dataclass
class TrainState:
    """step: int32[]; params: trainable pytree (or LoraParams); frozen: pytree ({} if none);
    opt_state: optimizer state of ``params``; rng: uint32[2] raw PRNG key (split once per step)."""

    step: jax.Array
    params: Any
    frozen: Any
    opt_state: Any
    rng: jax.Array


def split_params(params: dict, frozen_regex: str | None) -> tuple[dict, dict]:
    """(trainable, frozen) nested dicts: leaves whose '/'-path matches ``frozen_regex`` go to frozen."""
    if not frozen_regex:
        return params, {}
    regex = re.compile(frozen_regex)
    trainable: dict = {}
    frozen: dict = {}
    for path, leaf in flatten_with_paths(params).items():
        node = frozen if regex.search(path) else trainable
        parts = path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = leaf
    if not frozen:
        raise ValueError(f"freeze regex {frozen_regex!r} matches no parameter")
    return trainable, frozen


def merge_trees(a: dict, b: dict) -> dict:
    """Deep union of two nested dicts with disjoint leaves (used to rejoin trainable and frozen params)."""
    out = dict(a)
    for key, value in b.items():
        if key in out:
            if not (isinstance(out[key], dict) and isinstance(value, dict)):
                raise ValueError(f"parameter {key!r} is both trainable and frozen")
            out[key] = merge_trees(out[key], value)
        else:
            out[key] = value
    return out


def model_params(trainable, frozen):
    """The full parameter tree the model reads: LoRA merged on the fly, or trainable ∪ frozen."""
    if isinstance(trainable, LoraParams):
        return apply_lora(frozen, trainable)
    if not frozen:
        return trainable
    return merge_trees(trainable, frozen)


def cast_floating(tree, dtype):
    """Cast every floating leaf to ``dtype`` (integer leaves untouched)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def create_train_state(
    params,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    *,
    freeze_regex: str | None = None,
    lora: LoraConfig | None = None,
    frozen_dtype=None,
) -> TrainState:
    """A fresh TrainState. With ``lora`` every base param is frozen and adapters are trainable; otherwise leaves
    matching ``freeze_regex`` (e.g. ``^visual/``) are frozen. ``rng``: a raw uint32[2] key (jax.random.PRNGKey)."""
    rng = jnp.asarray(rng)
    # Weakly typed leaves (e.g. from jnp.full(shape, 0.1)) would come back strongly typed from the first step and
    # make the second call compile again.
    params = jax.tree.map(lambda x: jnp.asarray(x, x.dtype) if getattr(x, "weak_type", False) else x, params)
    if lora is not None:
        rng, lora_rng = jax.random.split(rng)
        trainable, frozen = jax.jit(init_lora, static_argnums=1)(params, lora, lora_rng), params
    else:
        trainable, frozen = split_params(params, freeze_regex)
    if frozen_dtype is not None and frozen:
        frozen = cast_floating(frozen, frozen_dtype)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=trainable,
        frozen=frozen,
        opt_state=jax.jit(optimizer.init)(trainable),  # jitted: one compile instead of one per leaf shape
        rng=rng,
    )


def state_from_config(params, config: ml_collections.ConfigDict, rng: jax.Array):
    """(TrainState, optimizer, schedule) from a ``default_train_config()``-shaped config."""
    optimizer = make_optimizer(config.optimizer)
    lora = lora_config_from(config)
    freeze = config.freeze_regex if (config.freeze_vision and lora is None) else None
    frozen_dtype = None if config.frozen_dtype == "float32" else config.frozen_dtype
    state = create_train_state(params, optimizer, rng, freeze_regex=freeze, lora=lora, frozen_dtype=frozen_dtype)
    return state, optimizer, make_schedule(config.optimizer)


# --------------------------------------------------------------------------------------------- sharding


def train_state_shardings(state: TrainState, optimizer, mesh, params_shardings, frozen_shardings) -> TrainState:
    """TrainState of NamedShardings: optimizer moments follow their params, everything else is replicated.

    ``params_shardings`` / ``frozen_shardings``: trees of NamedSharding matching ``state.params`` / ``state.frozen``
    (for LoRA use ``lora.lora_shardings``). ``state`` may be abstract (jax.eval_shape).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        state.opt_state,
        params_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    return TrainState(
        step=replicated,
        params=params_shardings,
        frozen=frozen_shardings,
        opt_state=opt_shardings,
        rng=replicated,
    )


# ------------------------------------------------------------------------------------------------- step


def stack_microbatches(batches):
    """A list of A same-shaped batches -> one batch whose leaves have a leading [A, ...] axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


LossFn = Callable[[Any, Any, jax.Array], tuple[jax.Array, dict]]


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    schedule: optax.Schedule | None = None,
    grad_accum_steps: int = 1,
    weight_key: str | None = None,
    compute_dtype=None,
    mesh=None,
    state_shardings: TrainState | None = None,
    batch_shardings=None,
    donate: bool = True,
):
    """The jitted ``step(state, batch) -> (state, metrics)``.

    ``loss_fn(params, batch, rng) -> (loss f32[], metrics dict of f32[])`` sees the full model params (trainable
    rejoined with frozen, LoRA merged, cast to ``compute_dtype`` when given — master weights stay fp32 and
    gradients come back in fp32). ``metrics[weight_key]`` (e.g. 'tokens') is the micro-batch's weight: the step's
    loss is Σ wᵢ·lossᵢ / Σ wᵢ over micro-batches (exactly the full-batch mean), other metrics are averaged with
    the same weights and the weight itself is summed. Without ``weight_key`` micro-batches weigh the same.

    Returned metrics: loss, grad_norm (before clipping), lr (of this update, when ``schedule`` is given), the
    weight, and every metric of ``loss_fn``. With ``mesh``, the step is jitted with ``state_shardings`` /
    ``batch_shardings`` in and out (metrics replicated) and traced under ``jax.set_mesh(mesh)``.
    """
    accum = int(grad_accum_steps)
    if accum < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {accum}")

    def weighted_loss(trainable, frozen, batch, rng):
        params = model_params(trainable, frozen)
        if compute_dtype is not None:
            params = cast_floating(params, compute_dtype)
        loss, metrics = loss_fn(params, batch, rng)
        loss = loss.astype(jnp.float32)
        weight = jnp.asarray(metrics[weight_key] if weight_key else 1.0, jnp.float32)
        weight = jax.lax.stop_gradient(weight)
        return loss * weight, (loss, weight, metrics)

    grad_fn = jax.grad(weighted_loss, has_aux=True)

    def step(state: TrainState, batch):
        rng, step_rng = jax.random.split(state.rng)
        if accum == 1:
            grads, (loss, weight, metrics) = grad_fn(state.params, state.frozen, batch, step_rng)
            total_w = weight
            mean_loss = loss
            mean_metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        else:
            rngs = jax.random.split(step_rng, accum)

            def micro(carry, xs):
                g_sum, = carry
                mb, r = xs
                g, (loss, weight, metrics) = grad_fn(state.params, state.frozen, mb, r)
                g_sum = jax.tree.map(jnp.add, g_sum, g)
                return (g_sum,), (loss, weight, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()})

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32 if _is_float(p) else p.dtype),
                                 state.params)
            (grads,), (losses, weights, metrics) = jax.lax.scan(micro, (zeros,), (batch, rngs))
            total_w = jnp.sum(weights)
            safe = jnp.where(total_w > 0, total_w, 1.0)
            mean_loss = jnp.sum(losses * weights) / safe
            mean_metrics = {k: jnp.sum(v * weights) / safe for k, v in metrics.items()}
        safe_w = jnp.where(total_w > 0, total_w, 1.0)
        grads = jax.tree.map(lambda g, p: (g / safe_w).astype(p.dtype), grads, state.params)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out = dict(mean_metrics)
        out["loss"] = mean_loss
        out["grad_norm"] = grad_norm
        if weight_key:
            out[weight_key] = total_w
        if schedule is not None:
            out["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, rng=rng)
        return new_state, out

    donate_argnums = (0,) if donate else ()
    if mesh is None:
        return jax.jit(step, donate_argnums=donate_argnums)

    from jax.sharding import NamedSharding, PartitionSpec

    if state_shardings is None:
        raise ValueError("make_train_step: a mesh needs state_shardings (see train_state_shardings)")
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(
        step,
        in_shardings=(state_shardings, batch_shardings),
        out_shardings=(state_shardings, replicated),
        donate_argnums=donate_argnums,
    )

    def step_under_mesh(state, batch):
        with jax.set_mesh(mesh):
            return jitted(state, batch)

    step_under_mesh.jitted = jitted
    return step_under_mesh


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


# ------------------------------------------------------------------------------------------------ SFT loss


def next_token_nll(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed NLL of the masked next tokens and their count.

    logits: f32[B, T, V] (position t predicts token t+1); input_ids: int32[B, T]; loss_mask: bool/int[B, T], 1 on
    tokens to be predicted (assistant-turn tokens). The mask is shifted with the targets: token t+1 is scored at
    position t iff loss_mask[t+1]; token 0 is never scored. Returns (nll_sum f32[], tokens f32[]).
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    token_logp = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return -jnp.sum(token_logp * mask), jnp.sum(mask)


def sft_loss(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, dict]:
    """Mean next-token cross-entropy over assistant tokens. -> (loss f32[], {'tokens': f32[]})."""
    nll, tokens = next_token_nll(logits, input_ids, loss_mask)
    return nll / jnp.maximum(tokens, 1.0), {"tokens": tokens}


def make_sft_loss(logits_fn: Callable[[Any, Any, jax.Array], jax.Array]) -> LossFn:
    """loss_fn for ``make_train_step`` from ``logits_fn(params, batch, rng) -> f32[B, T, V]``.

    ``batch`` is a mapping with at least ``input_ids`` int32[B, T] and ``loss_mask`` [B, T]. Use with
    ``weight_key='tokens'``.
    """

    def loss_fn(params, batch, rng):
        logits = logits_fn(params, batch, rng)
        return sft_loss(logits, batch["input_ids"], batch["loss_mask"])

    return loss_fn


def make_sft_step(logits_fn, optimizer, schedule=None, **kwargs):
    """``sft_step(state, batch) -> (state, metrics)``: the generic step with the SFT loss, weighted by tokens.

    metrics: loss, tokens, grad_norm, lr. ``kwargs`` go to ``make_train_step`` (grad_accum_steps, compute_dtype,
    mesh, state_shardings, batch_shardings).
    """
    return make_train_step(make_sft_loss(logits_fn), optimizer, schedule=schedule, weight_key="tokens", **kwargs)


# ------------------------------------------------------------------------------------ SFT on the Qwen2-VL model


def sft_model_batch(cfg, batch) -> dict:
    """Host-side: a collated ``data.dialogue.TrainingBatch`` -> the arrays the Qwen2-VL SFT loss reads.

    Returns numpy arrays {input_ids int32[B, T], attention_mask bool[B, T], loss_mask int32[B, T],
    positions int32[3, B, T] (M-RoPE, computed here), vision: model.VisionInputs with P = the batch's patch
    bucket} (no 'vision' key for a batch without images). Fully padded rows get position 0 and no loss.
    """
    from ipl_jax.model.inputs import get_rope_index, prepare_vision

    ids = np.asarray(batch.input_ids, np.int32)
    mask = np.asarray(batch.attention_mask, bool)
    pixels, grids = batch.packed_images()
    rows = np.flatnonzero(mask.any(axis=1))
    positions = np.zeros((3, *ids.shape), np.int32)
    if rows.size:
        pos, _ = get_rope_index(ids[rows], mask[rows], grids if len(grids) else None, cfg)
        positions[:, rows] = pos
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        "loss_mask": np.asarray(batch.loss_mask, np.int32),
        "positions": positions,
    }
    if len(grids):
        out["vision"] = prepare_vision(cfg, pixels, grids, patch_buckets=(batch.pixel_values.shape[0],))
    return out


def sft_batch_shardings(batch: Mapping[str, Any], mesh, grad_accum: bool = False):
    """NamedShardings for ``sft_model_batch`` arrays: text split over the batch axes, vision replicated.

    ``grad_accum``: leaves carry a leading micro-batch axis [A, ...] (kept unsharded).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    from ipl_jax.model.sharding import batch_spec

    lead = 1 if grad_accum else 0

    def text(x, axis):
        spec = tuple(batch_spec(mesh, x.shape[lead:], axis))
        return NamedSharding(mesh, PartitionSpec(*((None,) * lead + spec)))

    out = {}
    for key, value in batch.items():
        if key == "vision":
            out[key] = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), value)
        else:
            out[key] = text(value, 1 if key == "positions" else 0)
    return out


def qwen2vl_sft_loss(cfg, *, remat: bool = False, chunk: int = 128) -> LossFn:
    """loss_fn(params, batch, rng) for ``sft_model_batch`` arrays: mean next-token NLL over assistant tokens.

    Log-probs come from the final hidden states ``chunk`` positions at a time (``model.token_log_probs``), so the
    full [B, T, V] logits are never materialised. ``remat`` rematerialises decoder layers in the backward pass.
    """
    from ipl_jax.model.text import forward_hidden, token_log_probs
    from ipl_jax.model.vision import encode_images

    def loss_fn(params, batch, rng):
        del rng  # Qwen2-VL has no dropout
        feats = encode_images(params, cfg, batch["vision"]) if "vision" in batch else None
        ids = batch["input_ids"]
        hidden = forward_hidden(params, cfg, ids, batch["positions"], batch["attention_mask"], feats, remat=remat)
        # Position t predicts token t+1; the last position has no target (its mask entry is 0).
        targets = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
        target_mask = jnp.concatenate([batch["loss_mask"][:, 1:], jnp.zeros_like(batch["loss_mask"][:, :1])], 1)
        t = ids.shape[1]
        logp = token_log_probs(params, cfg, hidden, targets, chunk=chunk if t % min(chunk, t) == 0 else t)
        mask = target_mask.astype(jnp.float32)
        tokens = jnp.sum(mask)
        nll = -jnp.sum(logp * mask)
        return nll / jnp.maximum(tokens, 1.0), {"tokens": tokens}

    return loss_fn


def make_qwen2vl_sft_step(cfg, optimizer, schedule=None, *, remat: bool = False, chunk: int = 128, **kwargs):
    """``sft_step(state, batch) -> (state, metrics)`` for the Qwen2-VL model on ``sft_model_batch`` arrays.

    metrics: loss, tokens, grad_norm, lr. ``kwargs`` go to ``make_train_step``. For bf16 compute pass
    ``compute_dtype=jnp.bfloat16`` together with a ``cfg`` whose ``dtype`` is 'bfloat16'.
    """
    return make_train_step(qwen2vl_sft_loss(cfg, remat=remat, chunk=chunk), optimizer, schedule=schedule,
                           weight_key="tokens", **kwargs)


# ------------------------------------------------------------------------------------------------ the loop


def check_finite(metrics: Mapping[str, Any], step: int) -> None:
    """Raise NonFiniteLossError if the loss or gradient norm of ``step`` is NaN/inf."""
    for key in ("loss", "grad_norm"):
        if key in metrics and not math.isfinite(float(metrics[key])):
            values = {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}
            raise NonFiniteLossError(
                f"step {step}: {key} is {float(metrics[key])} — training stopped before saving; "
                f"the last checkpoint is untouched. metrics: {values}"
            )


def train_loop(
    state: TrainState,
    step_fn,
    batches: Iterator,
    num_steps: int,
    *,
    checkpointer=None,
    data_state_fn: Callable[[], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    on_metrics: Callable[[int, dict], None] | None = None,
) -> tuple[TrainState, list[dict]]:
    """Run ``step_fn`` until ``state.step == num_steps``; returns the final state and per-step host metrics.

    Every step's metrics are fetched and checked (NaN/inf raise ``NonFiniteLossError`` before anything is
    saved). With a ``checkpointer`` (``checkpoint.Checkpointer``) the state, ``data_state_fn()`` (the data
    iterator's state after the batches consumed so far) and ``metadata`` are saved on its schedule and at the end.
    A restored ``state`` resumes from its own step.
    """
    history: list[dict] = []
    step = int(state.step)
    try:
        while step < num_steps:
            batch = next(batches)
            state, metrics = step_fn(state, batch)
            metrics = {k: np.asarray(v).item() for k, v in jax.device_get(metrics).items()}
            step += 1
            check_finite(metrics, step)
            history.append(metrics)
            if on_metrics is not None:
                on_metrics(step, metrics)
            if checkpointer is not None:
                checkpointer.save(step, state, data_state=data_state_fn() if data_state_fn else None,
                                  metadata=metadata, force=step == num_steps)
    finally:
        if checkpointer is not None:
            checkpointer.wait()
    return state, history
