"""T-DPO on packed batches: loss and gradient against a direct per-pair implementation, reference log-probs,
train_round determinism / compilation / 8-device mesh, pairs from CoaT-trees, and one IPL round."""

import json
import os
import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import fake_devices
from support.compiles import count_traces
from support.small_models import IMG, VE, VS, make_groups, tiny_cfg, tiny_params
from support.tdpo_rounds import ROUND_PACKING, ROUND_TDPO, mesh_round, round_batches
from support.trees import assert_trees_close

from ipl_jax import fault_hook
from ipl_jax import model as M
from ipl_jax.coat.actions import ACTION_TYPES
from ipl_jax.coat.tree import CoaTTree
from ipl_jax.preference import losses
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK
from ipl_jax.preference import pairs as pairs_lib
from ipl_jax.preference import round as R
from ipl_jax.preference import tdpo as ipl

HERE = os.path.dirname(os.path.abspath(__file__))


def direct_inputs(cfg, groups, pairs):
    """Plain rows [prefix + chosen] and [prefix + rejected] for every pair (2k, 2k+1), right-padded to 32, plus
    where each row's continuation tokens are predicted: (inputs, rows int[R, C], cols, targets, weights)."""
    seqs, pixels, grids, where = [], [], [], []
    for p in pairs:
        g = groups[p.group]
        for i in (p.pos, p.neg):
            seqs.append(np.concatenate([g.prefix_ids, g.continuations[i]]))
            pixels.append(g.pixel_values)
            grids.append(g.image_grid_thw)
            where.append((len(g.prefix_ids), g.continuations[i], g.scored_mask(i)))
    inputs = M.prepare_inputs(
        cfg, seqs, None, np.concatenate(pixels), np.concatenate(grids), text_buckets=(32,), patch_buckets=(256,)
    )
    width = max(len(c) for _, c, _ in where)
    cols, targets, weights = (np.zeros((len(seqs), width), dt) for dt in (np.int32, np.int32, np.float32))
    for r, (L, c, scored) in enumerate(where):
        cols[r, : len(c)], targets[r, : len(c)], weights[r, : len(c)] = np.arange(L - 1, L - 1 + len(c)), c, scored
    rows = np.broadcast_to(np.arange(len(seqs))[:, None], cols.shape)
    return inputs, rows, cols, targets, weights


@jax.jit
def direct_row_logps(params, inputs, rows, cols, targets, weights):
    """Summed log p of each row's scored continuation tokens from a plain causal forward (no sharing)."""
    cfg = tiny_cfg()
    feats = M.encode_images(params, cfg, inputs.vision)
    logits = M.forward(params, cfg, inputs.input_ids, inputs.positions, inputs.attention_mask, feats)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.sum(logp[rows, cols, targets] * weights, axis=1)


def direct_loss(params, direct, n_pos, ref, beta, sft_weight):
    """−log σ(β[(πθ⁺ − πref⁺) − (πθ⁻ − πref⁻)]) + λ·(−πθ⁺ / n⁺), averaged over pairs, written out here."""
    lp = direct_row_logps(params, *direct)
    h = (lp[0::2] - ref[:, 0]) - (lp[1::2] - ref[:, 1])
    return jnp.mean(-jax.nn.log_sigmoid(beta * h) + sft_weight * (-lp[0::2] / n_pos))


@pytest.mark.parametrize("sft_weight", [0.0, 1.0])
@pytest.mark.e2e
def test_tdpo_loss_and_gradient_match_direct_per_pair_forward(sft_weight):
    cfg = tiny_cfg()
    params, ref_params = tiny_params(cfg, 0), tiny_params(cfg, 1)
    groups = make_groups(cfg, seed=5, n_groups=3, conts=(3, 2, 4), scored_groups=(1,))
    pairs = [PB.PairRef(0, 0, 1, 1), PB.PairRef(0, 2, 1, 2), PB.PairRef(1, 1, 0, 3), PB.PairRef(2, 3, 0, 4)]
    config = ipl.TDPOConfig(model=cfg, dpo=losses.DPOSettings(beta=0.5, sft_weight=sft_weight), logp_chunk=16)
    packing = ROUND_PACKING
    with jax.default_matmul_precision("highest"):
        data = ipl.attach_reference(ref_params, PK.pack_round(cfg, groups, pairs, packing), config)
        (batch,) = data.batches
        direct = direct_inputs(cfg, groups, pairs)
        ref = np.asarray(direct_row_logps(ref_params, *direct)).reshape(-1, 2)
        np.testing.assert_allclose(np.asarray(batch.ref_pos)[:4], ref[:, 0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(batch.ref_neg)[:4], ref[:, 1], atol=1e-5, rtol=0)
        assert np.all(np.asarray(batch.ref_pos)[4:] == 0)

        loss_fn = ipl.make_tdpo_loss(config)
        (loss, metrics), grads = jax.value_and_grad(lambda p: loss_fn(p, batch, None), has_aux=True)(params)
        n_pos = np.array([groups[p.group].scored_mask(p.pos).sum() for p in pairs], np.float32)
        want, want_grads = jax.value_and_grad(direct_loss)(params, direct, n_pos, ref, 0.5, sft_weight)
    assert float(metrics["pairs"]) == 4.0
    assert abs(float(want)) > 0.1
    np.testing.assert_allclose(float(loss), float(want), atol=1e-5, rtol=0)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads)) > 1e-2  # gradients far from zero
    assert_trees_close(grads, want_grads, rtol=0, atol=1e-5)


def test_loss_kinds_and_positive_sft_objective():
    """ipo / hinge and 'IPL without negatives' applied to given pair log-probs (no model needed)."""
    pos, neg = np.array([-3.0, -5.0, -2.0]), np.array([-4.0, -4.5, -9.0])
    ref_pos, ref_neg, n_pos = np.array([-3.5, -4.0, -1.0]), np.array([-3.0, -5.0, -1.0]), np.array([2.0, 4.0, 3.0])
    valid = np.array([True, True, False])
    batch = types.SimpleNamespace(pair_valid=valid, ref_pos=ref_pos, ref_neg=ref_neg)
    h = (pos - ref_pos) - (neg - ref_neg)
    cfg = tiny_cfg()
    for kind, per in (
        ("ipo", (h - 1 / 0.4) ** 2),
        ("hinge", np.maximum(0.0, 1 - 0.2 * h)),
        ("sigmoid", -np.log(1 / (1 + np.exp(-0.2 * h)))),
    ):
        config = ipl.TDPOConfig(model=cfg, dpo=losses.DPOSettings(beta=0.2, sft_weight=0.5, loss_kind=kind))
        loss, m = ipl.pair_loss(pos, neg, n_pos, batch, config)
        want = per[valid].mean() + 0.5 * (-pos / n_pos)[valid].mean()
        assert float(loss) == pytest.approx(want, rel=1e-6)
        assert float(m["reward_accuracy"]) == pytest.approx(0.5)
    config = ipl.TDPOConfig(model=cfg, objective="positive_sft")
    loss, m = ipl.pair_loss(pos, neg, n_pos, batch, config)
    assert float(loss) == pytest.approx((-pos / n_pos)[valid].mean(), rel=1e-6) and float(m["pairs"]) == 2
    with pytest.raises(ValueError, match="objective"):
        ipl.TDPOConfig(model=cfg, objective="nope")


def _leaves_equal(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)))


def test_train_round_compiles_its_update_once_and_counts_tokens():
    """A fresh state (host values and arrays not yet committed to a device) and the first update's outputs run
    the same program: a round of two updates compiles the update once."""
    cfg = tiny_cfg()
    config = ipl.TDPOConfig(model=cfg, **dict(ROUND_TDPO, logp_chunk=8))  # a config no other test compiles
    _, _, batches = round_batches(cfg, seed=12)
    data = ipl.attach_reference(tiny_params(cfg, 0), batches, config)
    loaded = jax.device_put(tiny_params(cfg, 0), jax.local_devices()[0])  # committed, like a loaded checkpoint
    state = ipl.init_state(loaded, config, jax.random.PRNGKey(0))
    compiles = []
    listener = lambda event, duration, **kw: (
        compiles.append(str(kw.get("fun_name"))) if event.endswith("backend_compile_duration") else None
    )
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        _, m = ipl.train_round(state, None, data, jax.random.PRNGKey(1), config)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert m["steps"] == 2 and sum("tdpo_update" in f for f in compiles) == 1, compiles
    assert m["tokens"] == sum(int(np.sum(np.asarray(b.segment_ids) >= 0)) for b in batches) > 0
    first = int(np.sum(np.asarray(batches[m["order"][0]].segment_ids) >= 0))
    assert m["first_step_tokens"] == first and 0 < m["first_step_seconds"] <= m["seconds"]


def test_train_round_runs_the_training_loop(monkeypatch):
    """T-DPO's epoch is the shared loop's (``training.loop``): the state placed once, the kill point ``tdpo_step``
    counted in the round's steps, no batches no steps."""
    cfg = tiny_cfg()
    config = ipl.TDPOConfig(model=cfg, **ROUND_TDPO)  # the other train_round tests' config: no new compile
    _, _, batches = round_batches(cfg, seed=10)
    kills, placed = [], []
    monkeypatch.setattr(fault_hook, "kill_at", lambda point, n: kills.append((point, n)))
    place = ipl.place_state
    monkeypatch.setattr(ipl, "place_state", lambda s, optimizer, mesh: placed.append(mesh) or place(s, optimizer, mesh))
    state = ipl.init_state(tiny_params(cfg, 0), config, jax.random.PRNGKey(0))
    state, m = ipl.train_round(state, tiny_params(cfg, 0), ipl.RoundData(batches), jax.random.PRNGKey(3), config)
    assert placed == [None] and kills == [("tdpo_step", 1), ("tdpo_step", 2)] and m["steps"] == len(m["per_step"]) == 2
    same, empty = ipl.train_round(state, None, ipl.RoundData([]), jax.random.PRNGKey(3), config)
    assert same is state and empty == {"steps": 0, "pairs": 0.0, "per_step": []} and placed == [None]


@pytest.mark.e2e
def test_train_round_is_deterministic_learns_and_a_second_round_compiles_nothing(monkeypatch, capsys):
    cfg = tiny_cfg()
    config = ipl.TDPOConfig(model=cfg, **ROUND_TDPO)
    ref = tiny_params(cfg, 0)
    _, _, round_a = round_batches(cfg, seed=10)
    _, _, round_b = round_batches(cfg, seed=11)

    def run(batches, key):
        state = ipl.init_state(tiny_params(cfg, 0), config, jax.random.PRNGKey(0))
        return ipl.train_round(state, ref, ipl.RoundData(batches), jax.random.PRNGKey(key), config)

    with count_traces() as first:
        s1, m1 = run(round_a, 3)
    s2, m2 = run(round_a, 3)
    assert _leaves_equal(s1, s2) and m1["per_step"] == m2["per_step"]
    assert sorted(m1["order"]) == [0, 1] and m1["steps"] == 2 and m1["pairs"] == 12.0
    assert int(s1.step) == 2 and not _leaves_equal(s1.params, ref)

    # a second round (new data, same shapes; reference = the first round's result) traces and compiles nothing
    programs = ("_tdpo_update", "_reference_unjitted")
    assert all(first[name] <= 1 for name in programs)  # at most once each (an earlier test may have built them)
    with count_traces() as second:
        s3, m3 = ipl.train_round(s1, s1.params, ipl.RoundData(round_b), jax.random.PRNGKey(4), config)
    assert [second[name] for name in programs] == [0, 0]
    assert int(s3.step) == 4 and np.isfinite(m3["loss"])

    # training raised the chosen-vs-rejected margin over the reference on the data it saw
    data = ipl.attach_reference(ref, round_a, config)
    loss_fn = jax.jit(ipl.make_tdpo_loss(config))
    before = [loss_fn(ref, b, None)[1] for b in data.batches]
    after = [loss_fn(s2.params, b, None)[1] for b in data.batches]
    assert all(float(m["reward_margin"]) == 0.0 for m in before)  # policy = reference
    assert all(float(m["reward_margin"]) > 0.0 for m in after)

    # progress: one log line per update at interval 0 (stderr is not a terminal here), finished steps only
    capsys.readouterr()
    monkeypatch.setenv("IPL_JAX_PROGRESS_INTERVAL", "0")
    monkeypatch.delenv("IPL_JAX_QUIET", raising=False)
    ipl.train_round(s3, s3.params, ipl.RoundData(round_a), jax.random.PRNGKey(6), config)
    lines = [line.split(" elapsed")[0] for line in capsys.readouterr().err.splitlines()]
    assert lines == [
        "reference log-probs: 1/2 batch (50%)",
        "reference log-probs: 2/2 batch (100%)",
        "T-DPO: 1/2 step (50%)",
        "T-DPO: 2/2 step (100%)",
    ]


MESH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from support.tdpo_rounds import mesh_round
    from ipl_jax.model import sharding as S

    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == 8
    losses, spec, leaf = mesh_round(S.make_mesh((2, 2, 2)))
    np.save(sys.argv[2], leaf)
    print(json.dumps({"losses": losses, "spec": spec}))
    """
)


@pytest.mark.e2e
def test_train_round_on_8_device_mesh_matches_single_device(tmp_path):
    out_leaf = str(tmp_path / "leaf.npy")
    proc = fake_devices.start(MESH_SCRIPT, HERE, out_leaf)
    try:  # the single-device run here, meanwhile
        with jax.default_matmul_precision("highest"):
            single, _, p1 = mesh_round(None)
    except BaseException:
        proc.kill()
        raise
    stdout, _ = fake_devices.finish(proc, timeout=400)
    out = json.loads(stdout.strip().splitlines()[-1])
    assert "fsdp" in out["spec"] and "tensor" in out["spec"], out["spec"]  # weights really are split
    assert len(single) == 2 and single[0] != single[1]
    np.testing.assert_allclose(out["losses"], single, atol=1e-5, rtol=0)
    p0 = np.asarray(tiny_params(tiny_cfg(), 0)["model"]["layers"]["mlp"]["up_proj"]["kernel"])
    assert np.max(np.abs(p1 - p0)) > 1e-5  # two Adam steps of 1e-5 moved the weights
    assert np.max(np.abs(p1 - np.load(out_leaf))) <= 1e-6


# ---------------------------------------------------------------------------------------- pairs from trees

BRANCHING = (2, 2, 2, 1)
EOT = 2  # stands in for <|im_end|>
CLICK, TYPE, SCROLL = (ACTION_TYPES.index(x) for x in ("click", "type", "scroll"))


def fake_steps(cfg, rng, n):
    steps = []
    for _ in range(n):
        prefix = np.asarray([3, VS, *[IMG] * 4, VE, *rng.integers(3, 59, 3), 4], np.int32)
        steps.append(
            types.SimpleNamespace(
                prefix_ids=prefix,
                turn_prompt_ids=tuple(np.asarray([5, 6 + t, 4], np.int32) for t in range(3)),
                pixel_values=rng.normal(size=(16, cfg.vision.patch_dim)).astype(np.float32),
                image_grid_thw=np.array([[1, 4, 4]]),
            )
        )
    return steps


def fake_tree(rng, b, turn_len=3):
    """Random turn texts of 1..turn_len tokens, each closed by EOT."""
    tree = CoaTTree.zeros(b, BRANCHING, (turn_len,) * 4)
    toks, lens = [], []
    for level in range(4):
        shape = tuple(np.asarray(tree.lengths[level]).shape)
        n = rng.integers(1, turn_len + 1, shape)
        t = rng.integers(7, 59, shape + (turn_len,))
        t = np.where(np.arange(turn_len) == (n - 1)[..., None], EOT, t)
        t = np.where(np.arange(turn_len) < n[..., None], t, 0)
        toks.append(jnp.asarray(t, jnp.int32))
        lens.append(jnp.asarray(n, jnp.int32))
    return tree.replace(
        tokens=tuple(toks),
        lengths=tuple(lens),
        finished=tuple(jnp.ones_like(x, bool) for x in lens),
        step_index=jnp.arange(b, dtype=jnp.int32),
        step_valid=jnp.ones((b,), bool),
    )


def backup(leaf_values, c=0.95):
    vals = [np.asarray(leaf_values, np.float32)]
    for _ in range(3):
        vals.insert(0, c * vals[0].mean(axis=-1))
    return tuple(vals)


def fake_sampled(cfg, rng, b=2):
    steps = fake_steps(cfg, rng, b)
    golden = np.array([[40, 41, EOT, 0]] * b, np.int32)
    return R.SampledTrees(
        tree=fake_tree(rng, b),
        steps=steps,
        golden_action_ids=golden,
        golden_action_lengths=np.full(b, 3, np.int32),
        golden_grounding_ids=np.array([[50, 51, 52, EOT]] * b, np.int32),
        golden_grounding_lengths=np.full(b, 4, np.int32),
    )


# tree 0: β (β pairs at turn 3 under the first two thoughts, at turn 2 under the second description);
# tree 1: γ (no correct leaf), golden click
LEAVES = np.array(
    [[1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [0.3, 0.0, 0.1, 0.0, 0.0, 0.6, 0.2, 0.0]], np.float32
).reshape(2, 2, 2, 2, 1)
LEAF_TYPES = np.array(
    [
        [CLICK, SCROLL, TYPE, SCROLL, SCROLL, SCROLL, TYPE, SCROLL],
        [CLICK, CLICK, TYPE, SCROLL, SCROLL, CLICK, TYPE, SCROLL],
    ],
    np.int32,
).reshape(2, 2, 2, 2, 1)


def fake_scores(sampled):
    return R.TreeScores(
        node_values=backup(LEAVES), leaf_types=LEAF_TYPES, golden_types=np.array([CLICK, CLICK], np.int32)
    )


def test_round_pairs_group_by_prefix_node_with_the_right_prefix_and_continuations():
    cfg = tiny_cfg()
    sampled = fake_sampled(cfg, np.random.default_rng(0))
    config = R.RoundConfig(tdpo=ipl.TDPOConfig(model=cfg))
    grouped, counts = R.round_pairs(sampled, fake_scores(sampled), config)
    assert counts.tolist() == [0, 1, 1]
    tree = jax.tree.map(np.asarray, sampled.tree)

    def text(level, row, *path):  # the level's text of the node with child choices ``path``
        return tree.tokens[level - 1][(row, *path)][: tree.lengths[level - 1][(row, *path)]]

    def text_flat(level, row, node):  # ... of the level's flat node ``node``
        return tree.tokens[level - 1].reshape(2, -1, 3)[row, node][: tree.lengths[level - 1].reshape(2, -1)[row, node]]

    # every pair: its group's prefix is the step prefix + s1 + prompt 2 + ... + prompt t for the pair's node
    assert grouped.pairs and len(grouped.pairs) == int(grouped.pairs_by_turn.sum())
    seen_turns = set()
    for p in grouped.pairs:
        g = grouped.groups[p.group]
        row = int(g.name.split("(row ")[1].split(")")[0])
        nodes = eval(g.name.split("prefix nodes ")[1])  # flat index of the prefix's node at levels 1..t-1
        step = sampled.steps[row]
        want = [step.prefix_ids]
        for level in range(1, p.turn):
            want += [text_flat(level, row, nodes[level - 1]), step.turn_prompt_ids[level - 1]]
        np.testing.assert_array_equal(g.prefix_ids, np.concatenate(want))
        seen_turns.add((row, p.turn))
        parent = nodes[-1] if nodes else 0
        sibling_texts = [
            tuple(text_flat(p.turn, row, parent * BRANCHING[p.turn - 1] + k)) for k in range(BRANCHING[p.turn - 1])
        ]
        pos, neg = tuple(g.continuations[p.pos]), tuple(g.continuations[p.neg])
        assert neg in sibling_texts
        if row == 1:  # γ: the golden text is the positive
            assert pos == ((40, 41, EOT) if p.turn == 3 else (50, 51, 52, EOT))
        else:
            assert pos in sibling_texts
        assert len({tuple(c) for c in g.continuations}) == len(g.continuations)  # shared once
    assert seen_turns == {(0, 2), (0, 3), (1, 3), (1, 4)}
    assert grouped.pairs_by_turn.tolist()[:3] == [0, 0, 1]
    keys = [g.name for g in grouped.groups]
    assert len(keys) == len(set(keys))  # one group per (row, turn, prefix node)

    naive = R.round_pairs(sampled, fake_scores(sampled), R.RoundConfig(tdpo=config.tdpo, pair_mode="naive"))[0]
    assert len(naive.pairs) == 1 and naive.pairs_by_turn.tolist() == [1, 0, 0, 0, 0]
    (g,) = naive.groups
    np.testing.assert_array_equal(g.prefix_ids, sampled.steps[0].prefix_ids)
    chosen = g.continuations[naive.pairs[0].pos]  # leaf 0 (path 0,0,0,0), a click: four turns
    step = sampled.steps[0]
    parts = [
        text(1, 0, 0),
        step.turn_prompt_ids[0],
        text(2, 0, 0, 0),
        step.turn_prompt_ids[1],
        text(3, 0, 0, 0, 0),
        step.turn_prompt_ids[2],
        text(4, 0, 0, 0, 0, 0),
    ]
    np.testing.assert_array_equal(chosen, np.concatenate(parts))
    scored = g.scored_mask(naive.pairs[0].pos)
    want_scored = np.concatenate([np.full(len(x), k % 2 == 0) for k, x in enumerate(parts)])
    np.testing.assert_array_equal(scored, want_scored)
    rejected = g.continuations[naive.pairs[0].neg]  # first lowest leaf: 1 (path 0,0,1), a scroll: no grounding
    np.testing.assert_array_equal(
        rejected,
        np.concatenate(
            [text(1, 0, 0), step.turn_prompt_ids[0], text(2, 0, 0, 0), step.turn_prompt_ids[1], text(3, 0, 0, 0, 1)]
        ),
    )


@pytest.mark.e2e
def test_ipl_round_chains_rounds_with_injected_stages():
    """Two rounds by hand, as the pipeline's loop runs them: the sampler of round 2 sees round 1's policy, the
    record counts trees, pairs and updates, and a control's update passed in (the continued-SFT control's) sees
    the round's packed batches, without reference log-probs when it does not read them."""
    cfg = tiny_cfg()
    tdpo = ipl.TDPOConfig(model=cfg, **ROUND_TDPO)  # the train_round test's config and shapes: no new compile
    config = R.RoundConfig(tdpo=tdpo, packing=ROUND_PACKING)
    seen = []

    def sample(params, n, rng):
        seen.append((n, np.asarray(params["lm_head"]["kernel"]).copy()))
        return [fake_sampled(cfg, np.random.default_rng(n))]

    stages = R.RoundStages(sample=sample, score=fake_scores)
    state0 = ipl.init_state(tiny_params(cfg, 0), tdpo, jax.random.PRNGKey(0))
    state1, r1 = R.ipl_round(state0, config, stages, 1, jax.random.PRNGKey(1))
    after1 = np.asarray(state1.params["lm_head"]["kernel"]).copy()
    state2, r2 = R.ipl_round(state1, config, stages, 2, jax.random.PRNGKey(2))
    assert np.array_equal(seen[1][1], after1) and not np.array_equal(seen[0][1], seen[1][1])
    assert r1["round"] == 1 and r1["classes"]["beta"] == 0.5 and r1["classes"]["gamma"] == 0.5
    assert r1["classes"]["trees"] == 2
    assert r1["pairs"] == sum(r1["pairs_by_turn"]) == r1["train"]["pairs"] > 0
    assert r1["pair_counts"]["by_class"]["beta"] + r1["pair_counts"]["by_class"]["gamma"] == r1["pairs"]
    assert np.isfinite(r1["train"]["loss"]) and r1["train"]["steps"] == r1["batches"] >= 1
    assert set(r1["seconds"]) >= {"sample_score_pairs", "pack_reference", "train", "total"}
    assert int(state2.step) == r1["train"]["steps"] + r2["train"]["steps"]

    calls = []

    def golden_update(state, data, rng):
        n = len(data.batches)
        calls.append((n, data.has_reference))
        return state, {"steps": n, "pairs": 0.0, "per_step": [{"loss": 1.0, "grad_norm": 0.5}] * n}

    control = R.RoundConfig(tdpo=tdpo, packing=ROUND_PACKING, train_on="golden")
    state0 = ipl.init_state(tiny_params(cfg, 0), tdpo, jax.random.PRNGKey(0))
    golden = R.RoundStages(sample=sample, score=fake_scores, update=golden_update, update_reads_reference=False)
    _, rc = R.ipl_round(state0, control, golden, 1, jax.random.PRNGKey(1))
    assert calls == [(r1["batches"], False)] and rc["batches"] == r1["batches"] and rc["pairs"] == r1["pairs"]
    assert rc["train"] == {"steps": r1["batches"], "pairs": 0.0}


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.e2e
def test_round_pairs_fit_k_plus_one_slots_for_larger_branching(k):
    """K = 3, 4 (the paper's ablation): a group holds at most K + 1 continuations (γ: golden + K sampled)."""
    cfg = tiny_cfg()
    rng = np.random.default_rng(k)
    branching = (k, k, k, 1)
    tree = CoaTTree.zeros(2, branching, (3,) * 4)
    toks = [
        jnp.asarray(np.where(np.arange(3) == 2, EOT, rng.integers(7, 59, tuple(x.shape))), jnp.int32)
        for x in tree.tokens
    ]
    tree = tree.replace(
        tokens=tuple(toks),
        lengths=tuple(jnp.full(x.shape, 3, jnp.int32) for x in tree.lengths),
        step_index=jnp.arange(2, dtype=jnp.int32),
        step_valid=jnp.ones((2,), bool),
    )
    leaves = np.zeros((2,) + branching, np.float32)
    leaves[0].reshape(-1)[rng.choice(k**3, k**3 // 2, replace=False)] = 1.0  # tree 0: β
    leaves[1] = rng.uniform(0, 0.5, leaves[1].shape)  # tree 1: γ
    types_ = np.full(leaves.shape, SCROLL, np.int32)
    sampled = R.SampledTrees(
        tree=tree,
        steps=fake_steps(cfg, rng, 2),
        golden_action_ids=np.array([[40, EOT]] * 2),
        golden_action_lengths=np.full(2, 2),
        golden_grounding_ids=np.array([[50, EOT]] * 2),
        golden_grounding_lengths=np.full(2, 2),
    )
    scores = R.TreeScores(node_values=backup(leaves), leaf_types=types_, golden_types=np.array([TYPE, TYPE]))
    caps = pairs_lib.PairConfig(max_beta_pairs_per_tree_turn=k**3, max_gamma_pairs_per_tree_turn=k**3)
    grouped, counts = R.round_pairs(sampled, scores, R.RoundConfig(tdpo=ipl.TDPOConfig(model=cfg), pairs=caps))
    assert counts.tolist() == [0, 1, 1]
    assert max(len(g.continuations) for g in grouped.groups) == k + 1  # a γ action node: golden + K sampled
    batches = PK.pack_round(
        cfg,
        grouped.groups,
        grouped.pairs,
        PB.PackingConfig(rows=8, max_continuations=k + 1, max_pairs=64, text_buckets=(64,), patch_buckets=(32,)),
    )
    assert sum(b.num_pairs for b in batches) == len(grouped.pairs) > 0
    with pytest.raises(ValueError, match="exceed max_continuations"):
        PK.pack_round(
            cfg,
            grouped.groups,
            grouped.pairs,
            PB.PackingConfig(rows=8, max_continuations=k, max_pairs=64, text_buckets=(64,), patch_buckets=(32,)),
        )


def test_ipl_round_diagnostics_score_its_own_and_held_out_pairs_before_and_after_the_update():
    """With a probe the round scores its own pairs and the pairs of held-out trees under π(n-1) and π(n): the
    figures equal those computed here from the reference log-probs of the same packed pairs under the two
    weights; the T-DPO update raises the implicit reward of the pairs it trained on; the probe sees π(n-1)
    before the update and π(n) after it; a control whose update leaves the weights as they were reports
    after == before and no implicit reward."""
    from ipl_jax.preference.selection import select_round_pairs

    cfg = tiny_cfg()
    tdpo = ipl.TDPOConfig(model=cfg, **ROUND_TDPO)
    config = R.RoundConfig(tdpo=tdpo, packing=ROUND_PACKING)
    heldout = fake_sampled(cfg, np.random.default_rng(7))
    seen = {}

    def head(params):
        return np.asarray(params["lm_head"]["kernel"]).copy()

    def before(params):
        seen["before"] = head(params)
        return "context"

    def after(params, context):
        seen["after"] = (head(params), context)
        return {"train_steps": {"steps": 3}}

    probe = R.RoundProbe(heldout=lambda params, rng: [(heldout, fake_scores(heldout))], before=before, after=after)

    def sample(params, n, rng):
        return [fake_sampled(cfg, np.random.default_rng(n))]

    def packed(sampled):  # the round's pairs of one sampled batch, as the round makes them
        pairs = R.round_pairs(sampled, fake_scores(sampled), config)[0]
        grouped, _ = select_round_pairs(pairs, config.selection, 1)
        return PK.pack_round(cfg, grouped.groups, grouped.pairs, ROUND_PACKING)

    def logps(params, batches):  # (pos, neg) of the valid pairs, from the reference log-probs
        data = ipl.attach_reference(params, batches, tdpo).batches
        valid = np.concatenate([np.asarray(b.pair_valid) for b in data])
        return tuple(np.concatenate([np.asarray(getattr(b, k)) for b in data])[valid] for k in ("ref_pos", "ref_neg"))

    state0 = ipl.init_state(tiny_params(cfg, 0), tdpo, jax.random.PRNGKey(0))  # its weights are donated
    state1, rec = R.ipl_round(
        state0, config, R.RoundStages(sample=sample, score=fake_scores, probe=probe), 1, jax.random.PRNGKey(1)
    )
    params0, params1 = tiny_params(cfg, 0), state1.params
    d = rec["diagnostics"]
    train = packed(fake_sampled(cfg, np.random.default_rng(1)))
    for name, batches in (("train_pairs", train), ("heldout_pairs", packed(heldout))):
        (sp, sn), (ep, en) = logps(params0, batches), logps(params1, batches)
        f = d[name]
        assert f["pairs"] == len(sp) > 0
        assert f["accuracy_before"] == pytest.approx(np.mean(sp > sn))
        assert f["accuracy_after"] == pytest.approx(np.mean(ep > en))
        assert f["logp_margin_before"] == pytest.approx(np.mean(sp - sn), rel=1e-5)
        assert f["logp_margin_after"] == pytest.approx(np.mean(ep - en), rel=1e-5)
        reward = 0.1 * ((ep - sp) - (en - sn))
        assert f["reward_margin"] == pytest.approx(np.mean(reward), rel=1e-4, abs=1e-7)
        assert f["reward_accuracy"] == pytest.approx(np.mean(reward > 0))
    assert d["train_pairs"]["pairs"] == rec["pairs"] and d["heldout_pairs"]["trees"] == 2
    assert d["train_pairs"]["reward_margin"] > 0 and d["train_pairs"]["reward_accuracy"] > 0.5  # it fitted its pairs
    assert np.array_equal(seen["before"], head(params0)) and np.array_equal(seen["after"][0], head(params1))
    assert seen["after"][1] == "context" and d["train_steps"] == {"steps": 3}
    assert rec["seconds"]["diagnostics"] > 0

    def unchanged(state, data, rng):
        return state, {"steps": len(data.batches), "pairs": 0.0, "per_step": []}

    control = R.RoundConfig(tdpo=tdpo, packing=ROUND_PACKING, train_on="golden")
    state0 = ipl.init_state(tiny_params(cfg, 0), tdpo, jax.random.PRNGKey(0))
    stages = R.RoundStages(
        sample=sample, score=fake_scores, update=unchanged, update_reads_reference=False, probe=probe
    )
    _, rc = R.ipl_round(state0, control, stages, 1, jax.random.PRNGKey(1))
    for name in ("train_pairs", "heldout_pairs"):
        f = rc["diagnostics"][name]
        assert (
            f["pairs"] == d[name]["pairs"] and f["accuracy_after"] == f["accuracy_before"] == d[name]["accuracy_before"]
        )
        assert f["reward_margin"] == 0.0 and f["reward_accuracy"] == 0.0
