"""Online PPO with dense rewards in live environments (``envs.protocol``), and GiGPPO (method.md §11): rollouts,
critic values, asymmetric GAE, then critic updates and (after the warm-up) dual-clip PPO updates with a k3 KL.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ipl_jax.coat.actions import needs_grounding
from ipl_jax.envs.protocol import Env, replicate
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl import advantages as adv_lib
from ipl_jax.rl import common, losses
from ipl_jax.rl import critic as critic_lib
from ipl_jax.rl.rollout import RolloutConfig, Trajectory, rollout, rollout_summary
from ipl_jax.rl.rows import RowConfig, Rows, build_rows, row_token_logps
from ipl_jax.rl.sampling import coat_row_spec, state_row_spec
from ipl_jax.rl.sections import PPOSettings
from ipl_jax.training import optimizer as optimizer_lib
from ipl_jax.training import state as state_lib
from ipl_jax.training import step as step_lib
from ipl_jax.training.loop import TrainLoop, check_finite, place_state


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO / GiGPPO as the ``rl.ppo`` section ``settings`` says (discounts, KL, value clip, critic warm-up, updates,
    learning rates, batch sizes), plus what is not a job setting: the GiGPPO switch, the terminal discount, the
    dual clip, critic updates, length_norm, normalize_advantages, the critic's frozen vision, ``grad_clip_norm``
    (the job's ``sft.grad_clip``, for the policy and the critic) and precision as in ``GRPOConfig``.
    """

    model: Qwen2VLConfig
    settings: PPOSettings = PPOSettings()
    gigppo: bool = False
    gamma_terminal: float = 1.0
    eps_low: float = 0.18
    eps_high: float = 0.22
    dual_clip: float = 3.0
    critic_updates: int = 1
    normalize_advantages: bool = True
    length_norm: str = "sequence"
    critic_freeze_vision: bool = True
    sibling_width: int = 64
    grad_clip_norm: float = 1.0
    rows: RowConfig = RowConfig()
    logp_chunk: int = 128
    remat: bool | str = False
    compute_dtype: str | None = None
    storage_dtype: str | None = None

    def __post_init__(self):
        if self.critic_updates < 1:
            raise ValueError(f"PPOConfig.critic_updates must be >= 1, got {self.critic_updates}")
        if self.gigppo and self.settings.trajectories_per_task < 2:
            raise ValueError(
                "PPOConfig.gigppo needs settings.trajectories_per_task >= 2 (siblings come from concurrent "
                "trajectories of the same task)"
            )

    def policy_optimizer_settings(self) -> optimizer_lib.OptimizerSettings:
        """The policy's optimizer settings (``settings.policy_learning_rate``, clipped at ``grad_clip_norm``)."""
        return self.settings.policy_optimizer(self.grad_clip_norm)

    def critic_optimizer_settings(self) -> optimizer_lib.OptimizerSettings:
        """The critic's optimizer settings (``settings.critic_learning_rate``, clipped at ``grad_clip_norm``)."""
        return self.settings.critic_optimizer(self.grad_clip_norm)


@struct.dataclass
class PPOState:
    """policy: TrainState of the policy; critic: TrainState of the critic params (``rl.critic``)."""

    policy: state_lib.TrainState
    critic: state_lib.TrainState


@struct.dataclass
class PPOBatch:
    """One minibatch of M steps: policy_rows / critic_rows ``Rows`` [M]; advantages f32[M]; returns, old_values
    f32[M, 2]; sibling f32[M, 4]; old_logps / ref_logps f32[M, T] or None (filled by ``ppo_step``)."""

    policy_rows: Rows
    critic_rows: Rows
    advantages: jax.Array
    returns: jax.Array
    old_values: jax.Array
    sibling: jax.Array
    old_logps: jax.Array | None = None
    ref_logps: jax.Array | None = None


def init_ppo_state(
    policy_params, config: PPOConfig, rng, *, policy_freeze_regex: str | None = None, frozen_dtype=None
) -> PPOState:
    """Policy and critic TrainStates (critic: a copy of the policy, fresh head). ``policy_params`` are donated to
    the policy state; frozen weights are kept in ``frozen_dtype`` (None: as given)."""
    rng_p, rng_c, rng_init = jax.random.split(jnp.asarray(rng), 3)
    critic = critic_lib.init_critic(policy_params, config.model, rng_init, config.sibling_width)
    pstate = state_lib.create_train_state(
        policy_params,
        optimizer_lib.make_optimizer(config.policy_optimizer_settings()),
        rng_p,
        freeze_regex=policy_freeze_regex,
        frozen_dtype=frozen_dtype,
    )
    cstate = state_lib.create_train_state(
        critic,
        optimizer_lib.make_optimizer(config.critic_optimizer_settings()),
        rng_c,
        freeze_regex=critic_lib.CRITIC_VISION_REGEX if config.critic_freeze_vision else None,
        frozen_dtype=frozen_dtype,
    )
    return PPOState(policy=pstate, critic=cstate)


# ------------------------------------------------------------------------------------------------ objectives


def policy_objective(params, batch: PPOBatch, config: PPOConfig):
    """Dual-clip PPO on every generated token of each step (the step's advantage broadcast), plus the k3 KL."""
    rows = batch.policy_rows
    logps = row_token_logps(params, config.model, rows, remat=config.remat, chunk=config.logp_chunk)
    w = common.sequence_weights(rows, config.length_norm)
    adv = jnp.broadcast_to(batch.advantages[:, None], logps.shape)
    pg = losses.ppo_dual_clip_loss(logps, batch.old_logps, adv, w, config.eps_low, config.eps_high, config.dual_clip)
    kl_tok = losses.k3_kl(logps, batch.ref_logps)
    denom = jnp.maximum(jnp.sum(w), 1e-9)
    kl = jnp.sum(kl_tok * w) / denom
    ratio = jnp.exp(logps - batch.old_logps)
    clipped = ((ratio < 1.0 - config.eps_low) | (ratio > 1.0 + config.eps_high)).astype(jnp.float32)
    metrics = {
        "policy_loss": pg,
        "kl": kl,
        "clip_frac": jnp.sum(clipped * w) / denom,
        "actions": jnp.sum(rows.row_valid.astype(jnp.float32)),
    }
    return pg + config.settings.kl_coef * kl, metrics


def critic_objective(params, batch: PPOBatch, config: PPOConfig):
    """The clipped value loss of both heads (``losses.clipped_value_loss``)."""
    sibling = batch.sibling if config.gigppo else None
    v = critic_lib.critic_values(params, config.model, batch.critic_rows, sibling, remat=config.remat)
    mask = jnp.broadcast_to(batch.critic_rows.row_valid[:, None], v.shape)
    loss = losses.clipped_value_loss(v, batch.old_values, batch.returns, mask, config.settings.value_clip)
    err = jnp.where(mask, v - batch.returns, 0.0)
    n = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    return loss, {
        "value_loss": loss,
        "value_mae": jnp.sum(jnp.abs(err)) / n,
        "states": jnp.sum(batch.critic_rows.row_valid.astype(jnp.float32)),
    }


def _ppo_update(state: state_lib.TrainState, batch: PPOBatch, kind: str, config: PPOConfig):
    objective, settings, weight = (
        (policy_objective, config.policy_optimizer_settings(), "actions")
        if kind == "policy"
        else (critic_objective, config.critic_optimizer_settings(), "states")
    )
    step = step_lib.train_step_fn(
        lambda params, b, rng: objective(params, b, config),
        optimizer_lib.make_optimizer(settings),
        schedule=optimizer_lib.make_schedule(settings),
        weight_key=weight,
        compute_dtype=config.compute_dtype,
    )
    return step(state, batch)


# jax.jit's own cache (keyed on the kind, the hashable config and the input shapes) holds the compiled updates.
_ppo_update_jit = jax.jit(_ppo_update, static_argnums=(2, 3), donate_argnums=(0,))


def _update(kind: str, config: PPOConfig):
    return lambda state, batch: _ppo_update_jit(state, batch, kind, config)


def ppo_step(state: PPOState, ref_params, batch: PPOBatch, rng, config: PPOConfig):
    """``critic_updates`` critic steps, then (after ``settings.critic_warmup``) ``settings.policy_updates`` policy
    steps; ``state`` donated, ``ref_params`` must not alias it. Returns (state, metrics)."""
    del rng
    cfg = config.model
    warm = int(state.critic.step) < config.settings.critic_warmup
    metrics = {}
    critic = state.critic
    for _ in range(config.critic_updates):
        critic, m = _update("critic", config)(critic, batch)
        metrics.update(
            {("critic_grad_norm" if k == "grad_norm" else k): v for k, v in m.items() if k not in ("loss", "lr")}
        )
    policy = state.policy
    if not warm:
        if batch.ref_logps is None:
            batch = batch.replace(
                ref_logps=common.reference_logps(
                    ref_params, cfg, batch.policy_rows, config.logp_chunk, config.compute_dtype
                )
            )
        if batch.old_logps is None:
            current = state_lib.model_params(policy.params, policy.frozen)
            batch = batch.replace(
                old_logps=common.reference_logps(
                    current, cfg, batch.policy_rows, config.logp_chunk, config.compute_dtype
                )
            )
        for _ in range(config.settings.policy_updates):
            policy, m = _update("policy", config)(policy, batch)
            metrics.update(
                {("policy_grad_norm" if k == "grad_norm" else k): v for k, v in m.items() if k not in ("loss", "lr")}
            )
    metrics["warmup"] = jnp.float32(warm)
    return PPOState(policy=policy, critic=critic), metrics


# ------------------------------------------------------------------------------------------------ a round


@dataclasses.dataclass
class _States:
    """The valid states of one rollout batch, flattened in (trajectory, step) order."""

    traj: np.ndarray  # int[N]
    t: np.ndarray  # int[N]
    records: list


def _flatten(trajs: Sequence[Trajectory]) -> _States:
    traj, t, records = [], [], []
    for j, tr in enumerate(trajs):
        if tr.unknown:  # cut unfinished by the budget, or ended by an environment's failure: no return to learn from
            continue
        for s in tr.steps:
            traj.append(j)
            t.append(s.t)
            records.append(s)
    return _States(np.asarray(traj, np.int64), np.asarray(t, np.int64), records)


def _minibatches(n: int, m: int) -> list[np.ndarray]:
    return [np.arange(i, min(n, i + m)) for i in range(0, n, m)]


def _critic_rows(config: PPOConfig, records, end_id: int) -> Rows:
    specs = [state_row_spec(r.prompt, end_id, i) for i, r in enumerate(records)]
    images = [(r.prompt.pixel_values, r.prompt.image_grid_thw) for r in records]
    return build_rows(config.model, specs, images, config.settings.minibatch_rows, config.rows)


def _policy_rows(config: PPOConfig, records) -> Rows:
    specs = [coat_row_spec(r.prompt, r.completion, needs_grounding(r.action), i) for i, r in enumerate(records)]
    images = [(r.prompt.pixel_values, r.prompt.image_grid_thw) for r in records]
    return build_rows(config.model, specs, images, config.settings.minibatch_rows, config.rows)


def _pad(x: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([x, np.zeros((n - len(x),) + x.shape[1:], x.dtype)]) if len(x) < n else x


def batch_advantages(trajs: Sequence[Trajectory], state: PPOState, config: PPOConfig, end_id: int):
    """(states, critic rows per minibatch, advantages f32[N], returns f32[N, 2], values f32[N, 2], sibling f32[N, 4])
    over a rollout batch's N >= 1 states of episodes with a known return (``Trajectory.unknown``)."""
    p = config.settings
    st = _flatten(trajs)
    n, m = len(st.records), p.minibatch_rows
    e, s_max = len(trajs), max(tr.num_steps for tr in trajs)
    rewards = np.zeros((e, s_max), np.float32)
    mask = np.zeros((e, s_max), bool)
    for j, tr in enumerate(trajs):
        if not tr.unknown:
            rewards[j, : tr.num_steps], mask[j, : tr.num_steps] = tr.step_rewards, True
    terminal = np.asarray([tr.terminal_reward for tr in trajs], np.float32)
    realised = np.asarray(adv_lib.stream_returns(rewards, terminal, mask, p.gamma_dense, config.gamma_terminal))[
        st.traj, st.t
    ]
    sibling = np.zeros((n, adv_lib.SIBLING_FEATURES), np.float32)
    if config.gigppo:
        thumbs = np.stack([r.thumb for r in st.records])
        group = st.traj // p.trajectories_per_task
        idx, dist, has = adv_lib.nearest_siblings(
            jnp.asarray(thumbs), jnp.asarray(group), jnp.asarray(st.traj), jnp.ones(n, bool)
        )
        sibling = np.asarray(adv_lib.sibling_features(jnp.asarray(realised), idx, dist, has))
    critic_params = state_lib.model_params(state.critic.params, state.critic.frozen)
    rows, values = [], []
    for sel in _minibatches(n, m):
        r = _critic_rows(config, [st.records[i] for i in sel], end_id)
        sib = jnp.asarray(_pad(sibling[sel], m)) if config.gigppo else None
        values.append(np.asarray(critic_lib.critic_values_jit(critic_params, config.model, r, sib))[: len(sel)])
        rows.append(r)
    values = np.concatenate(values)
    grid = np.zeros((e, s_max, 2), np.float32)
    grid[st.traj, st.t] = values
    adv, ret = adv_lib.asymmetric_gae(rewards, terminal, grid, mask, p.gamma_dense, p.lam, config.gamma_terminal)
    if config.normalize_advantages:
        adv = adv_lib.normalise_advantages(adv, mask)
    return st, rows, np.asarray(adv)[st.traj, st.t], np.asarray(ret)[st.traj, st.t], values, sibling


def minibatches(trajs, state: PPOState, config: PPOConfig, end_id: int):
    """The ``PPOBatch`` es of one rollout batch, advantages from ``state``'s critic (read before the first one)."""
    st, crows, adv, ret, values, sibling = batch_advantages(trajs, state, config, end_id)
    m = config.settings.minibatch_rows
    for k, sel in enumerate(_minibatches(len(st.records), m)):
        yield PPOBatch(
            policy_rows=_policy_rows(config, [st.records[i] for i in sel]),
            critic_rows=crows[k],
            advantages=jnp.asarray(_pad(adv[sel], m)),
            returns=jnp.asarray(_pad(ret[sel], m)),
            old_values=jnp.asarray(_pad(values[sel], m)),
            sibling=jnp.asarray(_pad(sibling[sel], m)),
        )


def check_step(metrics: dict, step: int) -> None:
    """The loop's non-finite check of a ``ppo_step``: its critic and policy losses and gradient norms."""
    check_finite(
        {
            "loss": metrics.get("value_loss", 0.0) + metrics.get("policy_loss", 0.0),
            "grad_norm": metrics.get("critic_grad_norm", 0.0) + metrics.get("policy_grad_norm", 0.0),
        },
        step,
    )


def place_ppo_state(state: PPOState, config: PPOConfig, mesh) -> PPOState:
    """The policy and the critic placed as ``training.loop.place_state`` places a state (the critic's model copy by
    the policy's partition rules)."""
    return PPOState(
        policy=place_state(state.policy, optimizer_lib.make_optimizer(config.policy_optimizer_settings()), mesh),
        critic=place_state(
            state.critic,
            optimizer_lib.make_optimizer(config.critic_optimizer_settings()),
            mesh,
            critic_lib.critic_state_shardings,
        ),
    )


@dataclasses.dataclass
class _Played:
    """A round's rollouts so far: environment steps spent, batches played, their trajectories and summaries."""

    used: int = 0
    batches: int = 0
    trajs: list = dataclasses.field(default_factory=list)
    summaries: list = dataclasses.field(default_factory=list)


def ppo_round(
    state: PPOState,
    ref_params,
    world_tasks: Sequence,
    rng,
    config: PPOConfig,
    *,
    envs: Sequence[Env],
    tokenizer,
    rollout_config: RolloutConfig,
    env_steps: int,
    mesh=None,
) -> tuple[PPOState, dict]:
    """Online PPO until ``env_steps`` environment steps are spent (the batch reaching it cuts its episodes, not
    trained on); episodes (``world_tasks``: ``EnvTask`` s) are played on ``envs`` by ``rollout_config`` with
    ``config.settings`` (its worlds per batch, its step and success rewards); ``ref_params`` None copies the starting
    policy. Returns (state, metrics).
    """
    if not world_tasks:
        raise ValueError("ppo_round: no world tasks")
    if env_steps < 1:
        raise ValueError(f"ppo_round: env_steps must be >= 1, got {env_steps}")
    if ref_params is None:
        ref_params = common.copy_params(common.policy_params(state.policy), config.storage_dtype)
    p = config.settings
    rcfg = dataclasses.replace(rollout_config, batch_size=p.worlds, settings=p, keep_prompts=True)
    end_id = int(rcfg.sampler.eos_ids[0])
    order = np.random.default_rng(common.key_seed(jax.random.fold_in(jnp.asarray(rng), 0))).permutation(
        len(world_tasks)
    )
    played = _Played()

    def batches():  # run by the loop between steps: ``loop.state`` is the current policy and critic
        while played.used < env_steps:
            b = played.batches
            chunk = [world_tasks[order[(b * p.tasks_per_batch + i) % len(order)]] for i in range(p.tasks_per_batch)]
            key = jax.random.fold_in(jnp.asarray(rng), b + 1)
            policy = common.policy_params(loop.state.policy, config.storage_dtype)
            worlds = replicate(chunk, p.trajectories_per_task)
            trajs = rollout(
                policy, config.model, tokenizer, worlds, envs, key, rcfg, mesh, max_env_steps=env_steps - played.used
            )
            del policy
            if any(tr.steps and not tr.unknown for tr in trajs):  # else no episode has a return to learn from
                yield from minibatches(trajs, loop.state, config, end_id)
            summary = rollout_summary(trajs)
            played.used += summary["env_steps"]
            played.summaries.append(summary)
            played.trajs.extend(trajs)
            played.batches += 1

    loop = TrainLoop(
        lambda st, batch: ppo_step(st, ref_params, batch, None, config),
        kill_point="ppo_minibatch",
        desc="PPO",
        unit="minibatch",
        place=functools.partial(place_ppo_state, config=config, mesh=mesh),
        check=check_step,
    )
    p0, c0 = int(state.policy.step), int(state.critic.step)
    state, per_update = loop.run(state, batches())
    out = {
        "train_episodes": rollout_summary(played.trajs),
        "env_steps": played.used,
        "rollout_batches": played.batches,
        "updates": int(state.policy.step) - p0,
        "critic_updates": int(state.critic.step) - c0,
        "per_batch": played.summaries,
    }
    out.update({k: v for k, v in common.mean_metrics(per_update, "states").items() if k != "steps"})
    return state, out
