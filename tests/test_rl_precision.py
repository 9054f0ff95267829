"""The RL rounds honour the job's precision like a T-DPO round: the learners' configs carry the compute dtype,
the remat policy and the storage dtype (from the same helpers as ``ipl.tdpo``), the sampler / rollout policy
and the frozen reference are storage-dtype copies, and the updates keep fp32 master weights and moments (read
from the traced update, nothing compiled)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("transformers")

from support import rl_setup as S

from ipl_jax.configs.loader import load_settings
from ipl_jax.pipeline import rl_round
from ipl_jax.pipeline.model_stage import Policy, job_model_config
from ipl_jax.rl import common, grpo, ppo
from ipl_jax.rl.rows import RowConfig, build_rows
from ipl_jax.rl.sampling import Completion, coat_row_spec, state_row_spec
from ipl_jax.training.state import VISION_REGEX

F32, BF16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)


class Stop(Exception):
    """Raised by a stand-in once it has seen what the test wants: nothing after it runs."""


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    tok = S.make_tokenizer(directory)
    cfg, params = S.make_model(tok)
    return Policy(params=params, cfg=cfg, tokenizer=tok, image_config=S.image_config(), source=str(directory))


def _job(**model):
    return load_settings("synthetic:quick", [f"--config.model.{k}={v}" for k, v in model.items()])


def floats(tree) -> set:
    return {jnp.dtype(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def _fresh(policy):
    return dataclasses.replace(policy, params=jax.tree.map(jnp.copy, policy.params))


def test_rl_configs_carry_the_job_precision(policy):
    job = _job(dtype="bfloat16", remat="full")
    g, p = rl_round.round_grpo_config(job, policy), rl_round.round_ppo_config(job, policy, gigppo=True)
    t = job.ipl.tdpo(job_model_config(policy.cfg, job.model), job.model.precision(), job.sft.grad_clip)
    for c in (g, p, t):
        assert (c.model.dtype, c.compute_dtype, c.remat) == ("bfloat16", "bfloat16", "full")
    assert g.storage_dtype == p.storage_dtype == t.reference_dtype == "bfloat16" and p.gigppo
    fp32 = rl_round.round_grpo_config(_job(), policy)  # a fresh model: fp32 throughout, no remat
    assert (fp32.model.dtype, fp32.compute_dtype, fp32.remat, fp32.storage_dtype) == (
        "float32",
        None,
        "none",
        "float32",
    )
    mixed = rl_round.round_ppo_config(_job(dtype="bfloat16", param_dtype="float32"), policy, gigppo=False)
    assert (mixed.compute_dtype, mixed.storage_dtype) == ("bfloat16", "float32")


def _recorder(seen: dict, key: str, fn):
    """``fn`` wrapped so that its result is also kept in ``seen[key]``."""

    def call(*a, **k):
        seen[key] = fn(*a, **k)
        return seen[key]

    return call


def test_grpo_round_samples_and_scores_the_reference_in_the_storage_dtype(policy, monkeypatch):
    job, seen = _job(dtype="bfloat16"), {}
    record_state, record_ref = _recorder(seen, "state", grpo.init_state), _recorder(seen, "ref", common.copy_params)

    def sample(params, steps, tokenizer, image_config, sampler, seed, config, mesh=None):
        seen["sampler"], seen["config"] = params, config
        raise Stop

    monkeypatch.setattr(grpo, "init_state", record_state)
    monkeypatch.setattr(common, "copy_params", record_ref)
    monkeypatch.setattr(grpo, "sample_batch", sample)
    with pytest.raises(Stop):
        rl_round.grpo_train(_fresh(policy), job, S.golden_steps(1)[:2], jax.random.PRNGKey(0), VISION_REGEX)
    assert floats(seen["sampler"]) == floats(seen["ref"]) == {BF16}
    assert seen["config"].model.dtype == "bfloat16"  # the sampler's KV cache follows the model's compute dtype
    state = seen["state"]
    assert floats(state.params) == floats(state.opt_state) == {F32}  # master weights and moments
    assert floats(state.frozen) == {BF16} and set(state.frozen) == {"visual"}  # the frozen vision tower


def test_ppo_round_rolls_out_and_scores_the_reference_in_the_storage_dtype(policy, monkeypatch):
    job, seen = _job(dtype="bfloat16"), {}
    record_state = _recorder(seen, "state", ppo.init_ppo_state)
    record_ref = _recorder(seen, "ref", common.copy_params)

    def play(params, cfg, tokenizer, world_tasks, envs, rng, config, mesh=None, max_env_steps=None):
        seen["rollout"], seen["cfg"], seen["limit"] = params, cfg, max_env_steps
        raise Stop

    monkeypatch.setattr(ppo, "init_ppo_state", record_state)
    monkeypatch.setattr(common, "copy_params", record_ref)
    monkeypatch.setattr(ppo, "rollout", play)
    with pytest.raises(Stop):
        rl_round.ppo_train(_fresh(policy), job, 32, jax.random.PRNGKey(0), VISION_REGEX, gigppo=False)
    assert floats(seen["rollout"]) == floats(seen["ref"]) == {BF16}
    assert seen["cfg"].dtype == "bfloat16" and seen["limit"] == 32
    state = seen["state"]
    for s in (state.policy, state.critic):
        assert floats(s.params) == floats(s.opt_state) == {F32}
        assert floats(s.frozen) == {BF16}


def _completion(tok):
    turns = tuple(np.asarray(tok.encode(t + "<|im_end|>"), np.int32) for t in ("a", "b", "wait", ""))
    return Completion(turns=turns, logps=tuple(np.zeros(len(t), np.float32) for t in turns), finished=(True,) * 4)


def test_bf16_rl_updates_keep_fp32_master_weights_and_moments(policy):
    """The GRPO update and PPO's policy and critic updates, traced with the job's bf16 settings: the model runs in
    bf16, the state comes back fp32 and the losses are fp32."""
    from ipl_jax.sampling.prompts import step_prompts

    job, tok, cfg = _job(dtype="bfloat16", remat="full"), policy.tokenizer, policy.cfg
    rows_cfg = RowConfig(text_buckets=(256,), patch_buckets=(64,))
    g = dataclasses.replace(rl_round.round_grpo_config(job, policy), rows=rows_cfg, logp_chunk=32)
    item = step_prompts(S.golden_steps(1)[0], tok, policy.image_config, cfg)
    image = [(item.pixel_values, item.image_grid_thw)]
    rows = build_rows(cfg, [coat_row_spec(item, _completion(tok), False, 0)] * 2, image, 2, rows_cfg)
    zeros = jnp.zeros(rows.input_ids.shape, jnp.float32)
    batch = grpo.GRPOBatch(rows=rows, advantages=jnp.array([1.0, -1.0]), old_logps=zeros, ref_logps=zeros)
    state = grpo.init_state(policy.params, g, jax.random.PRNGKey(0), freeze_regex=VISION_REGEX)
    new, m = jax.eval_shape(lambda s, b: grpo._grpo_update(s, b, g), state, batch)
    assert floats(new.params) == floats(new.opt_state) == {F32} and m["loss"].dtype == F32
    assert "bf16[" in str(jax.make_jaxpr(lambda s, b: grpo._grpo_update(s, b, g))(state, batch))

    p = rl_round.round_ppo_config(job, policy, gigppo=True)
    p = dataclasses.replace(p, settings=dataclasses.replace(p.settings, minibatch_rows=2), rows=rows_cfg, logp_chunk=32)
    critic_rows = build_rows(cfg, [state_row_spec(item, 1, 0)] * 2, image, 2, rows_cfg)
    pb = ppo.PPOBatch(
        policy_rows=rows,
        critic_rows=critic_rows,
        advantages=jnp.array([1.0, -1.0]),
        returns=jnp.ones((2, 2)),
        old_values=jnp.zeros((2, 2)),
        sibling=jnp.zeros((2, 4)),
        old_logps=zeros,
        ref_logps=zeros,
    )
    ps = ppo.init_ppo_state(policy.params, p, jax.random.PRNGKey(0), frozen_dtype="bfloat16")
    for kind, s, key in (("policy", ps.policy, "policy_loss"), ("critic", ps.critic, "value_loss")):
        new, m = jax.eval_shape(lambda s, b, kind=kind: ppo._ppo_update(s, b, kind, p), s, pb)
        assert floats(new.params) == floats(new.opt_state) == {F32} and m[key].dtype == F32, kind


def test_the_job_samples_and_evaluates_policy_directories_in_the_storage_dtype(policy, tmp_path):
    """The starting policy's selection, its and every round's evaluation load a policy directory (fp32 on disk) through
    ``Job.inference_policy``: storage-dtype weights, compute-dtype model, as the rounds' own sampling."""
    import types
    from pathlib import Path

    from ipl_jax.pipeline.model_stage import write_policy_dir
    from ipl_jax.pipeline.run import Job

    directory = write_policy_dir(tmp_path / "p", policy.params, policy.cfg, Path(policy.source), policy.image_config)
    job = types.SimpleNamespace(settings=_job(dtype="bfloat16"))
    loaded = Job.inference_policy(job, directory)
    assert floats(loaded.params) == {BF16} and loaded.cfg.dtype == "bfloat16"
    mixed_job = types.SimpleNamespace(settings=_job(dtype="bfloat16", param_dtype="float32"))
    mixed = Job.inference_policy(mixed_job, directory)
    assert floats(mixed.params) == {F32} and mixed.cfg.dtype == "bfloat16"
