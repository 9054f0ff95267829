"""GRPO end to end on a tiny random Qwen2-VL: groups from the jitted samplers, training rows that reproduce the
sampler's log-probs, and updates that follow the sign of the advantage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("transformers")

from support import rl_setup as S

from ipl_jax import fault_hook
from ipl_jax.rl import grpo
from ipl_jax.rl import sampling as RS
from ipl_jax.rl.rows import RowConfig, build_rows, frozen_token_logps
from ipl_jax.rl.sections import GRPOSettings

ROWS = RowConfig(text_buckets=(256,), patch_buckets=(64,))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = S.make_tokenizer(tmp_path_factory.mktemp("tok"))
    cfg, params = S.make_model(tok)
    return tok, cfg, params, S.golden_steps(1)


def _config(cfg, **settings):
    """G = 3, 2 prompts per batch, ``settings`` (``rl.grpo``'s fields) over them."""
    section = GRPOSettings(**{"group_size": 3, "prompts_per_batch": 2, **settings})
    return grpo.GRPOConfig(model=cfg, settings=section, rows=ROWS, logp_chunk=32)


def _copy(params):
    return jax.tree.map(jnp.copy, params)


@pytest.mark.e2e
def test_coat_groups_and_rows_reproduce_the_sampler(setup):
    tok, cfg, params, steps = setup
    config = _config(cfg)
    sc = RS.coat_group_config(S.sampler_config(tok), config.settings.group_size)
    items = grpo._prompts(steps[:2], tok, S.image_config(), config)
    groups = RS.sample_coat_groups(params, cfg, items, sc, 5, 2)
    again = RS.sample_coat_groups(params, cfg, items, sc, 5, 2)
    other = RS.sample_coat_groups(params, cfg, items, sc, 6, 2)
    flat = lambda gs: [tuple(map(tuple, c.turns)) for g in gs for c in g]
    assert flat(groups) == flat(again) and flat(groups) != flat(other)
    assert len(set(flat(groups)[:3])) == 3  # the G chains of one step differ
    specs = [RS.coat_row_spec(items[i], c, True, i) for i in range(2) for c in groups[i]]
    rows = build_rows(cfg, specs, [(it.pixel_values, it.image_grid_thw) for it in items], 8, ROWS)
    assert rows.input_ids.shape == (8, 256) and not rows.row_valid[6:].any() and not rows.target_mask[6:].any()
    lp = np.asarray(frozen_token_logps(params, cfg, rows, 32))
    want = [sum(float(np.sum(x)) for x in c.logps) for g in groups for c in g]
    np.testing.assert_allclose(lp.sum(1)[:6], want, atol=2e-3)
    assert int(rows.target_mask.sum(1)[0]) == sum(len(t) for t in groups[0][0].turns)


@pytest.mark.e2e
def test_think_answer_groups_reproduce_the_sampler(setup):
    tok, cfg, params, steps = setup
    sc = S.sampler_config(tok).replace(max_turn_tokens=(12, 1, 1, 1))
    items = [RS.think_answer_prompt(s, tok, S.image_config(), cfg) for s in steps[:2]]
    groups = RS.sample_single_turn(params, cfg, items, 3, sc, 0, 2)
    assert all(len(c.turns) == 1 and 1 <= len(c.turns[0]) <= 12 for g in groups for c in g)
    specs = [RS.single_turn_row_spec(items[i], c, i) for i in range(2) for c in groups[i]]
    rows = build_rows(cfg, specs, [(it.pixel_values, it.image_grid_thw) for it in items], 6, ROWS)
    lp = np.asarray(frozen_token_logps(params, cfg, rows, 32))
    np.testing.assert_allclose(lp.sum(1), [float(np.sum(c.logps[0])) for g in groups for c in g], atol=2e-3)


@pytest.mark.e2e
def test_grpo_step_follows_the_advantage_sign(setup):
    tok, cfg, params, steps = setup
    config = _config(cfg, learning_rate=3e-3, kl_beta=0.0)
    batch, info = grpo.sample_batch(params, steps[:2], tok, S.image_config(), S.sampler_config(tok), 0, config)
    adv = jnp.array([1.0, -1.0, 0.0, -1.0, 1.0, 0.0])  # hand-set, two groups of three
    batch = batch.replace(advantages=adv)
    before = np.asarray(frozen_token_logps(params, cfg, batch.rows, 32)).sum(1)
    state = grpo.init_state(_copy(params), config, jax.random.PRNGKey(0))
    state, m = grpo.grpo_step(state, _copy(params), batch, jax.random.PRNGKey(1), config)
    after = np.asarray(frozen_token_logps(state.params, cfg, batch.rows, 32)).sum(1)
    up = np.sign(after - before)
    assert list(up[[0, 4]]) == [1, 1] and list(up[[1, 3]]) == [-1, -1], (before, after)
    assert float(m["completions"]) == 6.0 and float(m["kl"]) == 0.0 and np.isfinite(float(m["loss"]))
    assert info["completions"] == 6 and np.asarray(info["rewards"].total).shape == (2, 3)


@pytest.mark.e2e
def test_round_without_reward_signal_changes_nothing(setup, monkeypatch):
    """A random policy earns no reward: every group is flat, so every advantage is 0 (never NaN) and — the
    reference being the starting policy — the gradient is only the rounding noise between the reference's and
    the step's forward (Adam would still turn that into lr-sized steps, so the test reads the gradient)."""
    tok, cfg, params, steps = setup
    config = _config(cfg)
    kills = []  # the shared training loop's kill point, counted in updates
    monkeypatch.setattr(fault_hook, "kill_at", lambda point, n: kills.append((point, n)))
    state = grpo.init_state(_copy(params), config, jax.random.PRNGKey(0))
    state, m = grpo.grpo_round(
        state,
        None,
        steps[:3],
        jax.random.PRNGKey(2),
        config,
        tokenizer=tok,
        image_config=S.image_config(),
        sampler=S.sampler_config(tok),
    )
    assert m["completions"] == 9.0 and m["updates"] == 2 and m["abs_advantage"] == 0.0
    assert kills == [("grpo_update", 1), ("grpo_update", 2)]
    assert all(np.isfinite(v) for k, v in m.items() if isinstance(v, float))
    assert max(s["grad_norm"] for s in m["per_step"]) < 1e-3 and m["kl"] < 1e-6
