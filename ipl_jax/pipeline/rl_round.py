"""One round of the other seeds' learners inside the job's round loop (docs/method.md §11): ``ipl.method`` =
``grpo`` (UI-R1's rule-reward GRPO on the round's training steps) or ``ppo`` / ``gigppo`` (online PPO with dense
rewards in the live synthetic world, GiGPPO's sibling-conditioned critic as a switch).

``pipeline.rounds.run_round`` hands a round to ``run_rl_round`` when the method is one of these; the loop over
rounds, the evaluation of each round and early stopping stay ``pipeline.run.Job.rounds``. A round spends the
sampled completions of the job's T-DPO round (``rl.job.round_budget``): GRPO draws ``ceil(budget / G)`` training
steps (a seeded sample per round, like T-DPO's) with G completions each; PPO plays the training split's tasks
until ``budget`` environment steps are spent (never more: the last rollout batch is cut at the budget). The
round record has the keys of a T-DPO round's (``pairs`` is 0, ``classes`` is empty: no trees are sampled) plus
``samples`` (completions or environment steps actually used), ``budget`` and ``method``.

Precision as in a T-DPO round (``model_stage.job_train_precision``, ``job_frozen_dtype``, ``inference_policy``):
the learners compute in ``model.dtype`` with ``model.remat``, keep fp32 master weights and moments, and sample,
roll out and score the reference from copies in the storage dtype; the round's dev evaluation reads the
``inference_policy``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections

from ipl_jax import distributed
from ipl_jax.data.records import Episode, Step
from ipl_jax.pipeline.model_stage import (
    Policy,
    inference_policy,
    job_frozen_dtype,
    job_mesh,
    job_model_config,
    job_train_precision,
    load_policy,
    write_policy_dir,
)
from ipl_jax.pipeline.round_eval import dev_accuracy
from ipl_jax.pipeline.round_settings import ipl_settings
from ipl_jax.pipeline.workdir import Workdir, write_json


def _scalars(metrics: dict) -> dict:
    """The round's update metrics without the per-batch lists (those stay out of round.json's summary)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool | int | float):
            out[k] = v
        elif isinstance(v, dict) and k == "train_episodes":
            out[k] = v
    return out


def grpo_settings(config: ml_collections.ConfigDict, policy: Policy):
    """The round's ``GRPOConfig``: the job's ``rl.grpo`` section with its precision (compute dtype, remat,
    storage dtype of the sampler's and the reference's weights)."""
    from ipl_jax.rl import job as rl_job

    cfg = job_model_config(config, policy.cfg)
    return rl_job.grpo_config(config, cfg, int(policy.tokenizer.ids.pad), **job_train_precision(config))


def ppo_settings(config: ml_collections.ConfigDict, policy: Policy, gigppo: bool):
    """The round's ``PPOConfig``: the job's ``rl.ppo`` section with its precision (as ``grpo_settings``)."""
    from ipl_jax.rl import job as rl_job

    cfg = job_model_config(config, policy.cfg)
    return rl_job.ppo_config(config, cfg, int(policy.tokenizer.ids.pad), gigppo, **job_train_precision(config))


def grpo_train(policy: Policy, config: ml_collections.ConfigDict, steps: Sequence[Step], rng, freeze):
    """GRPO over ``steps``. Returns (params, metrics, completions sampled)."""
    from ipl_jax.eval.trees import sampler_config
    from ipl_jax.rl import grpo
    from ipl_jax.rl import job as rl_job
    from ipl_jax.training.state import model_params

    gcfg = grpo_settings(config, policy)
    sampler = rl_job.sampler_for_batch(config, sampler_config(config, policy.tokenizer), gcfg.prompts_per_batch)
    state = grpo.init_state(policy.params, gcfg, rng, freeze_regex=freeze, frozen_dtype=job_frozen_dtype(config))
    state, m = grpo.grpo_round(
        state,
        None,
        steps,
        rng,
        gcfg,
        tokenizer=policy.tokenizer,
        image_config=policy.image_config,
        sampler=sampler,
        mesh=policy.mesh,
    )
    samples = int(sum(p["completions"] for p in m["per_step"]))
    m["steps"] = m["updates"]
    return model_params(state.params, state.frozen), m, samples


def ppo_train(policy: Policy, config: ml_collections.ConfigDict, budget: int, rng, freeze, gigppo: bool):
    """Online PPO (GiGPPO) on the training split's live tasks until ``budget`` environment steps are spent.
    Returns (params, metrics, environment steps used)."""
    from ipl_jax.eval.online import job_world_tasks
    from ipl_jax.eval.trees import reward_config, sampler_config
    from ipl_jax.rl import job as rl_job
    from ipl_jax.rl import ppo
    from ipl_jax.training.state import model_params

    p = config.rl.ppo
    pcfg = ppo_settings(config, policy, gigppo)
    tasks = job_world_tasks(config, "train", max_steps=int(p.max_steps), step_factor=float(p.step_factor))
    rcfg = rl_job.rollout_config(
        config, sampler_config(config, policy.tokenizer), policy.image_config, reward_config(config)
    )
    state = ppo.init_ppo_state(
        policy.params, pcfg, rng, policy_freeze_regex=freeze, frozen_dtype=job_frozen_dtype(config)
    )
    state, m = ppo.ppo_round(
        state,
        None,
        tasks,
        rng,
        pcfg,
        tokenizer=policy.tokenizer,
        rollout_config=rcfg,
        env_steps=budget,
        mesh=policy.mesh,
    )
    m["steps"] = m["updates"]
    return model_params(state.policy.params, state.policy.frozen), m, int(m["env_steps"])


def run_rl_round(
    config: ml_collections.ConfigDict,
    wd: Workdir,
    round_index: int,
    start: Path,
    train_steps: Sequence[Step],
    dev_episodes: Sequence[Episode],
) -> dict:
    """One GRPO / PPO / GiGPPO round from the policy directory ``start``; writes ``rounds/<r>/policy`` and
    ``round.json``. Returns the round record (``round``, ``method``, ``pairs`` = 0, ``classes`` = {}, ``samples``,
    ``budget``, ``train``, ``dev``, ``seconds``, ``policy``)."""
    from ipl_jax.eval.seed_selection import sample_steps
    from ipl_jax.rl import job as rl_job
    from ipl_jax.training.state import VISION_REGEX

    s = ipl_settings(config)  # validate.py has refused ipl.lora_rank > 0 with these methods
    t0 = time.perf_counter()
    policy = load_policy(start, job_mesh(config))
    budget = rl_job.round_budget(config, len(train_steps))
    rng = jax.random.PRNGKey(int(config.seed) * 7919 + round_index)
    freeze = VISION_REGEX if s.freeze_vision else None
    if s.method == "grpo":
        n = rl_job.grpo_prompts(budget, int(config.rl.grpo.group_size))
        steps = sample_steps(train_steps, n, int(config.seed) * 1000 + round_index)
        steps = (steps * -(-n // len(steps)))[:n]  # fewer training steps than prompts: visit them again
        params, metrics, samples = grpo_train(policy, config, steps, rng, freeze)
    else:
        params, metrics, samples = ppo_train(policy, config, budget, rng, freeze, gigppo=s.method == "gigppo")
    t_train = time.perf_counter() - t0
    record = {
        "round": round_index,
        "method": s.method,
        "pairs": 0,
        "classes": {},
        "samples": samples,
        "budget": budget,
        "train": _scalars(metrics),
    }
    t1 = time.perf_counter()
    record["dev"] = dev_accuracy(inference_policy(policy, config, params), dev_episodes, config)
    record["seconds"] = {
        "train": t_train,
        "evaluate": time.perf_counter() - t1,
        "total": time.perf_counter() - t0,
    }
    unit = "completions" if s.method == "grpo" else "environment steps"
    wd.echo(
        f"  round {round_index} ({s.method}): {samples} {unit} (budget {budget}), {metrics['updates']} updates, "
        f"dev step accuracy {record['dev']['step_accuracy']:.4f}, {record['seconds']['total']:.1f}s"
    )
    out_dir = wd.dir("rounds", str(round_index))
    write_policy_dir(out_dir / "policy", params, policy.cfg, start, policy.image_config)
    if wd.main:
        write_json(out_dir / "round.json", record)
    distributed.barrier(f"round {round_index} written")
    record["policy"] = str(out_dir / "policy")
    return record
