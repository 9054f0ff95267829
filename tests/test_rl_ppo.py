"""Online PPO / GiGPPO end to end on a tiny random Qwen2-VL in the live world. The episodes are played by a
scripted stand-in policy (``rl.rollout.act`` patched) that follows the expert on some steps and babbles on the
others, so that rewards, successes and failures all occur; the learner's updates run on the real model."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("transformers")

from support import rl_setup as S

from ipl_jax import fault_hook
from ipl_jax.coat.actions import format_action, format_grounding, needs_grounding
from ipl_jax.envs.protocol import replicate
from ipl_jax.envs.synthetic.env import SyntheticEnv, split_world_tasks
from ipl_jax.rl import ppo
from ipl_jax.rl import rollout as R
from ipl_jax.rl.rows import RowConfig, frozen_token_logps
from ipl_jax.rl.sampling import Completion
from ipl_jax.rl.sections import PPOSettings

ROWS = RowConfig(text_buckets=(320,), patch_buckets=(256,))


def mixed_act(tokenizer):
    """The expert's action on 2 of 3 (episode, step) pairs (a stable hash), an unparsable text on the rest."""

    def act(params, cfg, items, steps, seed, config, mesh=None):
        out = []
        for step in steps:
            a = step.action
            good = zlib.crc32(f"{step.episode_id}/{step.step_id}".encode()) % 3 != 0
            s3, s4 = (format_action(a), format_grounding(a.box) if needs_grounding(a) else "") if good else ("hmm", "")
            turns = tuple(np.asarray(tokenizer.encode(t + "<|im_end|>"), np.int32) for t in ("a", "b", s3, s4))
            out.append(
                Completion(turns=turns, logps=tuple(np.zeros(len(t), np.float32) for t in turns), finished=(True,) * 4)
            )
        return out

    return act


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = S.make_tokenizer(tmp_path_factory.mktemp("tok"))
    cfg, params = S.make_model(tok)
    tasks = split_world_tasks("train", 4, seed=0, max_steps=6)
    rc = R.RolloutConfig(sampler=S.sampler_config(tok), image_config=S.image_config(), batch_size=4)
    return tok, cfg, params, tasks, rc


ENVS = [SyntheticEnv() for _ in range(4)]
SECTION = {"tasks_per_batch": 2, "trajectories_per_task": 2, "minibatch_rows": 8}


def _config(cfg, settings=None, **kw):
    """2 tasks x 2 trajectories, minibatches of 8 rows, ``settings`` (``rl.ppo``'s fields) over them; ``kw``:
    ``PPOConfig``'s own fields."""
    section = PPOSettings(**{**SECTION, **(settings or {})})
    return ppo.PPOConfig(model=cfg, settings=section, **{"rows": ROWS, "logp_chunk": 32, **kw})


def _copy(params):
    return jax.tree.map(jnp.copy, params)


@pytest.mark.e2e
def test_ppo_step_moves_policy_by_advantage_and_critic_towards_returns(setup, monkeypatch):
    tok, cfg, params, tasks, rc = setup
    monkeypatch.setattr(R, "act", mixed_act(tok))
    section = {"critic_warmup": 0, "policy_updates": 1, "kl_coef": 0.0}
    config = _config(cfg, {**section, "policy_learning_rate": 3e-3, "critic_learning_rate": 3e-3}, critic_updates=1)
    trajs = R.rollout(None, cfg, tok, replicate(tasks[:2], 2), ENVS, jax.random.PRNGKey(0), rc)
    assert any(t.success for t in trajs) and any(s.reward == 0 for t in trajs for s in t.steps)
    state = ppo.init_ppo_state(_copy(params), config, jax.random.PRNGKey(0))
    st, crows, adv, ret, values, _ = ppo.batch_advantages(trajs, state, config, int(rc.sampler.eos_ids[0]))
    np.testing.assert_array_equal(values, 0.0)  # a fresh critic
    np.testing.assert_allclose(adv.std(), 1.0, rtol=1e-3)  # normalised over the rollout batch
    sel = np.arange(8)
    # +1 for the expert's actions, -1 for the babble: equal rows always get equal signs
    hand = np.array([1.0 if st.records[i].action.parsed else -1.0 for i in sel], np.float32)
    assert 0 < (hand > 0).sum() < 8
    batch = ppo.PPOBatch(
        policy_rows=ppo._policy_rows(config, [st.records[i] for i in sel]),
        critic_rows=crows[0],
        advantages=jnp.asarray(hand),
        returns=jnp.asarray(ret[sel]),
        old_values=jnp.asarray(values[sel]),
        sibling=jnp.zeros((8, 4)),
    )
    n_tok = np.asarray(batch.policy_rows.target_mask).sum(1)

    def surrogate(p):  # Σ_i A_i · mean_t log π(o_it): what one small step of the (sequence-normalised) loss raises
        return float(np.sum(hand * np.asarray(frozen_token_logps(p, cfg, batch.policy_rows, 32)).sum(1) / n_tok))

    before = surrogate(params)
    state, m = ppo.ppo_step(state, _copy(params), batch, jax.random.PRNGKey(1), config)
    assert surrogate(state.policy.params) > before + 1.0
    first_mae = float(m["value_mae"])
    for _ in range(5):
        state, m = ppo.ppo_step(
            state, _copy(params), batch.replace(old_values=jnp.asarray(values[sel])), jax.random.PRNGKey(1), config
        )
    assert float(m["value_mae"]) < first_mae and float(m["warmup"]) == 0.0


@pytest.mark.e2e
def test_ppo_round_budget_and_warmup(setup, monkeypatch):
    tok, cfg, params, tasks, rc = setup
    monkeypatch.setattr(R, "act", mixed_act(tok))
    config = _config(cfg, {"critic_warmup": 2})
    state = ppo.init_ppo_state(_copy(params), config, jax.random.PRNGKey(0))
    state, m = ppo.ppo_round(
        state, None, tasks, jax.random.PRNGKey(4), config, envs=ENVS, tokenizer=tok, rollout_config=rc, env_steps=30
    )
    assert m["env_steps"] == 30  # the batch that reaches the budget is cut there (hand counts below)
    assert m["env_steps"] == m["train_episodes"]["env_steps"] == sum(b["env_steps"] for b in m["per_batch"])
    assert m["critic_updates"] == int(state.critic.step) and m["critic_updates"] >= 3
    assert m["updates"] == config.settings.policy_updates * (m["critic_updates"] - config.settings.critic_warmup)
    assert 0.0 < m["train_episodes"]["success_rate"] < 1.0
    assert all(np.isfinite(v) for v in (m["value_loss"], m["policy_loss"], m["kl"]))


@pytest.mark.e2e
def test_gigppo_siblings_from_concurrent_trajectories(setup, monkeypatch):
    tok, cfg, params, tasks, rc = setup
    monkeypatch.setattr(R, "act", mixed_act(tok))
    config = _config(cfg, gigppo=True)
    trajs = R.rollout(None, cfg, tok, replicate(tasks[:2], 2), ENVS, jax.random.PRNGKey(0), rc)
    state = ppo.init_ppo_state(_copy(params), config, jax.random.PRNGKey(0))
    st, _, _, _, _, sib = ppo.batch_advantages(trajs, state, config, int(rc.sampler.eos_ids[0]))
    assert np.all(sib[:, 3] == 1.0)  # every state has a sibling in the other trajectory of its task
    first = st.t == 0
    np.testing.assert_array_equal(sib[first, 2], 0.0)  # both trajectories start on the same screen
    # a first step's sibling is the other trajectory's first state: its realised return is the sibling feature
    from ipl_jax.rl.advantages import stream_returns

    j = int(np.flatnonzero(first & (st.traj == 0))[0])
    other = trajs[1]
    g = np.asarray(
        stream_returns(other.step_rewards[None], np.array([other.terminal_reward]), np.ones((1, other.num_steps), bool))
    )[0, 0]
    np.testing.assert_allclose(sib[j, :2], g, atol=1e-6)
    with pytest.raises(ValueError, match="trajectories_per_task"):
        _config(cfg, {"trajectories_per_task": 1}, gigppo=True)


def babble_act(tokenizer):
    """Unparsable completions only: every step is a no-op, so every episode runs to its step limit."""

    def act(params, cfg, items, steps, seed, config, mesh=None):
        turns = tuple(np.asarray(tokenizer.encode(t + "<|im_end|>"), np.int32) for t in ("a", "b", "hmm", ""))
        c = Completion(turns=turns, logps=tuple(np.zeros(len(t), np.float32) for t in turns), finished=(True,) * 4)
        return [c] * len(steps)

    return act


@pytest.mark.e2e
def test_ppo_round_never_passes_its_budget(setup, monkeypatch):
    tok, cfg, params, _, rc = setup
    monkeypatch.setattr(R, "act", babble_act(tok))
    tasks = [t for t in split_world_tasks("train", 8, seed=0, max_steps=3) if t.step_limit == 3][:4]
    assert len(tasks) == 4
    # 4 worlds of 3 steps each; a budget of 6: step 0 takes 4, step 1 the first 2 worlds (the others are cut
    # unfinished), step 2 none
    trajs = R.rollout(None, cfg, tok, replicate(tasks[:2], 2), ENVS, jax.random.PRNGKey(0), rc, max_env_steps=6)
    assert [t.num_steps for t in trajs] == [2, 2, 1, 1] and all(t.cut and not t.truncated for t in trajs)
    summary = R.rollout_summary(trajs)
    assert summary["env_steps"] == 6 and summary["budget_cut"] == 4 and summary["success_rate"] is None
    config = _config(cfg, {"critic_warmup": 2})  # the settings of test_ppo_round_budget_and_warmup: its programs
    kills = []  # the shared training loop's kill point, counted in minibatches
    monkeypatch.setattr(fault_hook, "kill_at", lambda point, n: kills.append((point, n)))
    state = ppo.init_ppo_state(_copy(params), config, jax.random.PRNGKey(0))
    state, m = ppo.ppo_round(
        state, None, tasks, jax.random.PRNGKey(4), config, envs=ENVS, tokenizer=tok, rollout_config=rc, env_steps=30
    )
    # whole batches would spend 12 + 12 + 12 = 36; the third is cut after 4 + 2 of its steps
    assert [b["env_steps"] for b in m["per_batch"]] == [12, 12, 6] and m["env_steps"] == 30
    assert [b["budget_cut"] for b in m["per_batch"]] == [0, 0, 4] and m["rollout_batches"] == 3
    # the cut batch is not trained on: 2 batches x 2 minibatches (12 states, 8 rows each) x 1 critic update, and
    # the policy's 2 updates per minibatch after the 2 warm-up updates
    assert m["critic_updates"] == 4 and m["updates"] == 2 * (4 - 2)
    assert kills == [("ppo_minibatch", k) for k in (1, 2, 3, 4)]
    train = m["train_episodes"]
    assert train["episodes"] == 12 and train["budget_cut"] == 4 and train["truncated_rate"] == 1.0
