"""GRPO with UI-R1's rule reward (method.md §11): G completions per step, group-normalised advantages, then
``grpo_step`` (reference log-probs once, μ clipped updates with a k3 KL), sampling with the current policy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.coat.rewards import encode_actions, reshape_leading
from ipl_jax.data.dialogue import DEFAULT_PROMPTS, CoaTPrompts
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl import common, losses
from ipl_jax.rl import rewards as rewards_lib
from ipl_jax.rl import sampling as rl_sampling
from ipl_jax.rl.rows import RowConfig, Rows, build_rows, row_token_logps
from ipl_jax.rl.sections import GRPOSettings
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.prompts import step_prompts
from ipl_jax.training import optimizer as optimizer_lib
from ipl_jax.training import state as state_lib
from ipl_jax.training import step as step_lib
from ipl_jax.training.loop import TrainLoop, place_state


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO as the ``rl.grpo`` section ``settings`` says (UI-R1's defaults: G, style, clipping, KL, μ, length_norm,
    prompts per batch, learning rate, DAST), plus what is not a job setting: the rule reward, ``grad_clip_norm``,
    rows, prompts, ``compute_dtype`` / ``remat`` / ``storage_dtype`` (precision of update and copies).
    """

    model: Qwen2VLConfig
    settings: GRPOSettings = GRPOSettings()
    reward: rewards_lib.UIR1RewardConfig = rewards_lib.UIR1RewardConfig()
    adv_eps: float = 1e-4
    grad_clip_norm: float = 1.0
    rows: RowConfig = RowConfig()
    prompts: CoaTPrompts = DEFAULT_PROMPTS
    max_history: int | None = None  # think/answer prompt: keep the last N previous actions
    logp_chunk: int = 128
    remat: bool | str = False
    compute_dtype: str | None = None
    storage_dtype: str | None = None

    @property
    def optimizer_settings(self) -> optimizer_lib.OptimizerSettings:
        """The policy's optimizer settings (``settings.learning_rate``, constant, clipped at ``grad_clip_norm``)."""
        return self.settings.optimizer(self.grad_clip_norm)


@struct.dataclass
class GRPOBatch:
    """rows: ``Rows`` [R = prompts · G]; advantages f32[R] (0 on padding); old_logps f32[R, T] or None (current
    policy); ref_logps f32[R, T] or None (computed by ``grpo_step``)."""

    rows: Rows
    advantages: jax.Array
    old_logps: jax.Array | None = None
    ref_logps: jax.Array | None = None


# ------------------------------------------------------------------------------------------------ the step


def grpo_objective(params, batch: GRPOBatch, config: GRPOConfig):
    """(loss, metrics) of one batch: ``losses.grpo_loss`` with ``settings.length_norm`` token weights."""
    g = config.settings
    logps = row_token_logps(params, config.model, batch.rows, remat=config.remat, chunk=config.logp_chunk)
    old = jax.lax.stop_gradient(logps) if batch.old_logps is None else batch.old_logps
    weights = common.sequence_weights(batch.rows, g.length_norm)
    loss, m = losses.grpo_loss(logps, old, batch.ref_logps, batch.advantages, weights, g.clip_eps, g.kl_beta)
    m = dict(m)
    m["completions"] = jnp.sum(batch.rows.row_valid.astype(jnp.float32))
    return loss, m


def _grpo_update(state: state_lib.TrainState, batch: GRPOBatch, config: GRPOConfig):
    def loss_fn(params, b, rng):
        del rng  # no dropout in the model
        return grpo_objective(params, b, config)

    step = step_lib.train_step_fn(
        loss_fn,
        optimizer_lib.make_optimizer(config.optimizer_settings),
        schedule=optimizer_lib.make_schedule(config.optimizer_settings),
        weight_key="completions",
        compute_dtype=config.compute_dtype,
    )
    return step(state, batch)


# jax.jit's own cache (keyed on the hashable config and the input shapes) holds the compiled updates.
_grpo_update_jit = jax.jit(_grpo_update, static_argnums=(2,), donate_argnums=(0,))


def make_grpo_update(config: GRPOConfig):
    """The jitted ``update(state, batch) -> (state, metrics)`` (state donated): one optimizer step."""
    return lambda state, batch: _grpo_update_jit(state, batch, config)


def init_state(params, config: GRPOConfig, rng, **kwargs) -> state_lib.TrainState:
    """A TrainState with ``config.optimizer_settings``; ``kwargs`` go to ``training.state.create_train_state``."""
    return state_lib.create_train_state(params, optimizer_lib.make_optimizer(config.optimizer_settings), rng, **kwargs)


def with_logps(state: state_lib.TrainState, ref_params, batch: GRPOBatch, config: GRPOConfig) -> GRPOBatch:
    """``batch`` with the reference's log-probs and, for μ > 1 updates, the current policy's (``old_logps``)."""
    cfg = config.model
    if batch.ref_logps is None:
        batch = batch.replace(
            ref_logps=common.reference_logps(ref_params, cfg, batch.rows, config.logp_chunk, config.compute_dtype)
        )
    if config.settings.updates_per_batch > 1 and batch.old_logps is None:
        current = state_lib.model_params(state.params, state.frozen)
        batch = batch.replace(
            old_logps=common.reference_logps(current, cfg, batch.rows, config.logp_chunk, config.compute_dtype)
        )
    return batch


def grpo_step(state: state_lib.TrainState, ref_params, batch: GRPOBatch, rng, config: GRPOConfig):
    """μ = ``settings.updates_per_batch`` updates on one batch; ``state`` donated, ``ref_params`` must not alias it.
    Returns (state, metrics of the last update).
    """
    del rng
    batch = with_logps(state, ref_params, batch, config)
    update = make_grpo_update(config)
    metrics = {}
    for _ in range(config.settings.updates_per_batch):
        state, metrics = update(state, batch)
    return state, metrics


# ------------------------------------------------------------------------------------------------ a round


def _prompts(steps, tokenizer, image_config, config: GRPOConfig):
    cfg = config.model
    if config.settings.style == "coat":
        return [step_prompts(s, tokenizer, image_config, cfg, config.prompts) for s in steps]
    return [
        rl_sampling.think_answer_prompt(s, tokenizer, image_config, cfg, max_history=config.max_history) for s in steps
    ]


def sample_batch(
    params, steps: Sequence, tokenizer, image_config, sampler: SamplerConfig, seed, config: GRPOConfig, mesh=None
):
    """Sample, parse and score G completions for each of ``steps`` (at most ``prompts_per_batch``).
    Returns (GRPOBatch, info: rewards ``UIR1Rewards`` [B, G], parsed actions, ``completions``)."""
    style = config.settings.style
    b, g = config.settings.prompts_per_batch, config.settings.group_size
    steps = list(steps)
    items = _prompts(steps, tokenizer, image_config, config)
    if style == "coat":
        groups = rl_sampling.sample_coat_groups(
            params, config.model, items, rl_sampling.coat_group_config(sampler, g), seed, b, mesh
        )
        max_len = float(sum(sampler.max_turn_tokens))
    else:
        groups = rl_sampling.sample_single_turn(params, config.model, items, g, sampler, seed, b)
        max_len = float(sampler.max_turn_tokens[0])
    pad = b - len(steps)
    actions, fmt, lengths, specs = [], [], [], []
    for i, (item, group) in enumerate(zip(items, groups)):
        for c in group:
            action, ok, grounded = common.parse_completion(tokenizer, c, style)
            actions.append(action)
            fmt.append(ok)
            lengths.append(common.answer_length(c, grounded, style))
            specs.append(
                rl_sampling.coat_row_spec(item, c, grounded, i)
                if style == "coat"
                else rl_sampling.single_turn_row_spec(item, c, i)
            )
    actions += [None] * (pad * g)  # padding prompts: invalid actions, masked below
    fmt += [False] * (pad * g)
    lengths += [0] * (pad * g)
    valid = (np.arange(b) < len(steps))[:, None].repeat(g, 1)
    pred = reshape_leading(encode_actions(actions), (b, g))
    golden = rewards_lib.encode_uir1_golden(steps + [steps[-1]] * pad)
    r = rewards_lib.uir1_rewards(pred, jnp.asarray(np.reshape(fmt, (b, g))), golden, config.reward)
    r = rewards_lib.group_rewards(r, jnp.asarray(np.reshape(lengths, (b, g))), max_len, config.settings.dast)
    adv = rewards_lib.safe_group_advantages(r.total, jnp.asarray(valid), config.adv_eps)
    rows = build_rows(config.model, specs, [(it.pixel_values, it.image_grid_thw) for it in items], b * g, config.rows)
    batch = GRPOBatch(rows=rows, advantages=adv.reshape(-1))
    return batch, {"rewards": r, "actions": actions[: len(steps) * g], "valid": valid, "completions": len(steps) * g}


def _reward_metrics(r: rewards_lib.UIR1Rewards, valid: np.ndarray, adv) -> dict:
    v = np.asarray(valid, bool)
    out = {}
    names = {
        "reward": "total",
        "reward_type": "r_type",
        "reward_coord": "r_coord",
        "reward_format": "r_format",
        "reward_length": "r_length",
    }
    for key, field in names.items():
        out[key] = float(np.mean(np.asarray(getattr(r, field))[v]))
    out["correct"] = float(np.mean(np.asarray(r.correct)[v]))
    tot = np.asarray(r.total)
    out["groups_with_signal"] = float(np.mean([np.ptp(tot[i][v[i]]) > 0 for i in range(len(v)) if v[i].any()]))
    out["abs_advantage"] = float(np.mean(np.abs(np.asarray(adv).reshape(v.shape))[v]))
    return out


def grpo_round(
    state: state_lib.TrainState,
    ref_params,
    steps: Sequence,
    rng,
    config: GRPOConfig,
    *,
    tokenizer,
    image_config,
    sampler: SamplerConfig,
    mesh=None,
) -> tuple[state_lib.TrainState, dict]:
    """One GRPO pass over ``steps`` in batches of ``prompts_per_batch`` (batch i sampled with ``fold_in(rng, i)``
    by the current policy, then μ updates on it); ``ref_params`` None copies the starting policy. Returns (state,
    metrics).
    """
    steps = list(steps)
    if not steps:
        raise ValueError("grpo_round: no steps")
    if ref_params is None:
        ref_params = common.copy_params(common.policy_params(state), config.storage_dtype)
    b, mu = config.settings.prompts_per_batch, config.settings.updates_per_batch
    optimizer = optimizer_lib.make_optimizer(config.optimizer_settings)
    sampled: list[dict] = []  # per sampled batch: its reward figures and completions

    def batches():  # run by the loop between updates: ``loop.state`` is the current policy
        for i, start in enumerate(range(0, len(steps), b)):
            key = jax.random.fold_in(jnp.asarray(rng), i)
            policy = common.policy_params(loop.state, config.storage_dtype)
            batch, info = sample_batch(
                policy, steps[start : start + b], tokenizer, image_config, sampler, common.key_seed(key), config, mesh
            )
            del policy
            batch = with_logps(loop.state, ref_params, batch, config)
            rewards = _reward_metrics(info["rewards"], info["valid"], batch.advantages)
            sampled.append({**rewards, "completions": float(info["completions"])})
            yield from [batch] * mu  # μ updates on each sampled batch

    loop = TrainLoop(
        make_grpo_update(config),
        kill_point="grpo_update",
        desc="GRPO",
        unit="update",
        place=functools.partial(place_state, optimizer=optimizer, mesh=mesh),
    )
    state, history = loop.run(state, batches(), total=-(-len(steps) // b) * mu)
    # a sampled batch's record: its last update's metrics, its rewards
    per_step = [{**history[(i + 1) * mu - 1], **rec} for i, rec in enumerate(sampled)]
    out = common.mean_metrics(per_step, "completions")
    out["updates"] = len(per_step) * mu
    out["per_step"] = per_step
    return state, out
