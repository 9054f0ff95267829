"""The method's switches, each against hand-computed expectations: round-level pair selection (exact-duplicate
removal, action-type balancing, tree mixing), the γ modes, the SFT term's normalisation, thoughts that name an
action, the paired bootstrap of a gain, blank-screen evaluation, and the typed ``ipl`` settings."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.coat.actions import ACTION_TYPES, Action, thought_names_action
from ipl_jax.preference import losses
from ipl_jax.preference import pairs as P
from ipl_jax.preference.grouping import GroupedPairs
from ipl_jax.preference.packed_batch import PairRef, PrefixGroup
from ipl_jax.preference.sections import PairSelection
from ipl_jax.preference.selection import balance_types, drop_duplicates, mix_groups, select_round_pairs

CLICK, TYPE, SCROLL, PRESS, STOP = (ACTION_TYPES.index(x) for x in ("click", "type", "scroll", "press", "stop"))


def _group(prefix, *conts):
    return PrefixGroup(
        prefix_ids=np.asarray(prefix, np.int32),
        continuations=tuple(np.asarray(c, np.int32) for c in conts),
        name=f"g{prefix}",
    )


def _grouped(groups, pairs):
    by_turn = np.zeros(5, np.int64)
    for p in pairs:
        by_turn[p.turn] += 1
    return GroupedPairs(groups=list(groups), pairs=list(pairs), pairs_by_turn=by_turn)


def test_drop_duplicates_compares_prefix_and_both_continuations():
    groups = [_group([1, 2], [5], [6]), _group([1, 2], [5], [6], [7]), _group([1, 3], [5], [6])]
    pairs = [
        PairRef(0, 0, 1, 2),
        PairRef(1, 0, 1, 2),  # group 1 has group 0's prefix and texts: a copy
        PairRef(1, 0, 2, 2),  # other negative: kept
        PairRef(2, 0, 1, 2),  # other prefix: kept
        PairRef(0, 1, 0, 2),
    ]  # swapped roles: another preference, kept
    out, dropped = drop_duplicates(_grouped(groups, pairs))
    assert dropped == 1 and out.skipped == 1
    assert out.pairs == [pairs[0], pairs[2], pairs[3], pairs[4]]
    assert out.pairs_by_turn.tolist() == [0, 0, 4, 0, 0]


def test_balance_types_caps_each_type_at_ratio_times_the_median():
    g = [_group([1], [2], [3])]
    # 6 click pairs (gaps 0.1..0.6), 2 type, 1 scroll: median count 2 -> ratio 1.0 caps click at 2
    pairs = [PairRef(0, 0, 1, 3, CLICK, gap) for gap in (0.1, 0.6, 0.3, 0.5, 0.2, 0.4)]
    pairs += [PairRef(0, 0, 1, 3, TYPE, 0.9), PairRef(0, 0, 1, 2, TYPE, 0.8), PairRef(0, 0, 1, 1, SCROLL, 0.7)]
    out, dropped = balance_types(_grouped(g, pairs), 1.0)
    assert dropped == 4
    kept_click = [p.gap for p in out.pairs if p.pos_type == CLICK]
    assert kept_click == [0.6, 0.5]  # the two largest gaps, in their original order
    assert sum(p.pos_type == TYPE for p in out.pairs) == 2 and sum(p.pos_type == SCROLL for p in out.pairs) == 1
    assert out.pairs_by_turn.tolist() == [0, 1, 1, 3, 0]
    # counts 5 / 2 / 1, ratio 1.5: ceil(1.5 * 2) = 3 click pairs; equal gaps keep the earlier pairs
    tied = (
        [PairRef(0, 0, 1, 3, CLICK, 0.5) for _ in range(5)]
        + [PairRef(0, 0, 1, 3, TYPE, 0.5)] * 2
        + [PairRef(0, 0, 1, 3, SCROLL, 0.5)]
    )
    out, dropped = balance_types(_grouped(g, tied), 1.5)
    assert dropped == 2 and [p for p in out.pairs if p.pos_type == CLICK] == tied[:3]
    assert balance_types(_grouped(g, tied), 0.0)[1] == 0


def test_mix_groups_permutes_groups_and_keeps_every_pair_with_its_texts():
    groups = [_group([i], [10 + i], [20 + i]) for i in range(6)]
    pairs = [PairRef(i, 0, 1, 1 + i % 4) for i in range(6)]
    grouped = _grouped(groups, pairs)
    out = mix_groups(grouped, seed=3)
    assert [g.name for g in out.groups] != [g.name for g in groups]  # seed 3 moves them
    assert sorted(g.name for g in out.groups) == sorted(g.name for g in groups)
    seen = {
        (tuple(out.groups[p.group].prefix_ids), int(out.groups[p.group].continuations[p.pos][0]), p.turn)
        for p in out.pairs
    }
    assert seen == {((i,), 10 + i, 1 + i % 4) for i in range(6)}
    assert [p.group for p in out.pairs] == sorted(p.group for p in out.pairs)  # packing order follows groups
    assert [g.name for g in mix_groups(grouped, seed=3).groups] == [g.name for g in out.groups]  # seeded
    assert len(grouped.groups) == 6 and grouped.pairs == pairs  # input unchanged


def test_select_round_pairs_applies_the_switches_in_order():
    groups = [_group([1], [2], [3]), _group([1], [2], [3])]
    pairs = [PairRef(0, 0, 1, 3, CLICK, 0.5), PairRef(1, 0, 1, 3, CLICK, 0.5), PairRef(0, 1, 0, 3, TYPE, 0.2)]
    selection = PairSelection(dedup=True, type_balance=1.0, mix_trees=False)
    out, stats = select_round_pairs(_grouped(groups, pairs), selection, 0)
    assert stats == {"duplicates": 1, "type_balance": 0} and len(out.pairs) == 2
    with pytest.raises(ValueError, match="type_balance"):
        PairSelection(type_balance=-1.0)


# ------------------------------------------------------------------------------------------------- γ modes


def _gamma_tree():
    """One γ tree (no leaf = 1), branching (2, 2, 2, 1), golden type TYPE: every sampled s3 is a candidate."""
    leaves = np.array([0.2, 0.0, 0.1, 0.0, 0.0, 0.3, 0.0, 0.1], np.float32).reshape(1, 2, 2, 2, 1)
    vals = [leaves]
    for _ in range(3):
        vals.insert(0, 0.95 * vals[0].mean(axis=-1))
    types_ = np.full(leaves.shape, CLICK, np.int32)
    return tuple(jnp.asarray(v) for v in vals), jnp.asarray(types_), jnp.asarray([TYPE]), jnp.asarray([True])


@pytest.mark.e2e
def test_gamma_modes_restrict_action_turn_negatives():
    nv, lt, gt, valid = _gamma_tree()
    paper = P.extract_pairs(nv, lt, gt, valid, config=P.PairConfig())
    assert int(paper.count_by_turn[2]) == 8 and int(paper.count_by_turn[3]) == 0  # 8 sampled s3, no click golden
    assert np.all(np.asarray(paper.positive_type)[: int(paper.count)] == TYPE)  # γ positive = the golden type
    # "consistent": only s3 nodes below thoughts that name the golden action; thoughts (0,1) and (1,0) do
    names = jnp.asarray([[[False, True], [True, False]]])
    cons = P.extract_pairs(nv, lt, gt, valid, thought_allows_gamma=names, config=P.PairConfig())
    got = np.asarray(cons.negative_node)[: int(cons.count)]
    assert int(cons.count) == 4 and sorted(got.tolist()) == [2, 3, 4, 5]  # s3 children of flat thoughts 1 and 2
    none_ = P.extract_pairs(nv, lt, gt, valid, config=P.PairConfig(gamma_action_pairs=False))
    assert int(none_.count) == 0
    assert int(P.extract_pairs(nv, lt, gt, valid, config=P.PairConfig(turns=(1, 2, 4))).count) == 0
    with pytest.raises(ValueError, match="turns"):
        P.PairConfig(turns=(0, 3))
    with pytest.raises(ValueError, match="thought_allows_gamma"):
        P.extract_pairs(nv, lt, gt, valid, thought_allows_gamma=jnp.ones((1, 4), bool), config=P.PairConfig())


def test_beta_pairs_carry_the_type_of_the_positives_best_leaf():
    leaves = np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32).reshape(1, 2, 2, 2, 1)
    vals = [leaves]
    for _ in range(3):
        vals.insert(0, 0.95 * vals[0].mean(axis=-1))
    types_ = np.array([PRESS, CLICK, STOP, STOP, STOP, STOP, STOP, STOP], np.int32).reshape(leaves.shape)
    pb = P.extract_pairs(
        tuple(jnp.asarray(v) for v in vals),
        jnp.asarray(types_),
        jnp.asarray([PRESS]),
        jnp.asarray([True]),
        config=P.PairConfig(),
    )
    n = int(pb.count)
    assert n > 0 and np.all(np.asarray(pb.positive_type)[:n] == PRESS)  # every positive leads to the press leaf


# ------------------------------------------------------------------------------------------------- SFT term


def test_sft_term_per_token_or_summed():
    pos = jnp.asarray([-6.0, -2.0])
    neg = jnp.asarray([-7.0, -1.0])
    ntok = jnp.asarray([3.0, 1.0])
    zero = jnp.zeros(2)
    valid = jnp.asarray([True, True])
    # policy = reference: the DPO term is log 2 per pair; the SFT term is the mean NLL
    per_token, m1 = losses.tdpo_loss(pos, neg, zero + pos, zero + neg, ntok, valid, losses.DPOSettings())
    assert float(m1["sft_nll"]) == pytest.approx((6 / 3 + 2 / 1) / 2)
    summed, m2 = losses.tdpo_loss(
        pos, neg, zero + pos, zero + neg, ntok, valid, losses.DPOSettings(sft_norm="sum", sft_weight=0.5)
    )
    assert float(m2["sft_nll"]) == pytest.approx((6 + 2) / 2)
    assert float(summed) == pytest.approx(np.log(2) + 0.5 * 4.0, rel=1e-6)
    assert float(per_token) == pytest.approx(np.log(2) + 2.0, rel=1e-6)
    nll, _ = losses.positive_sft_loss(pos, ntok, valid, "sum")
    assert float(nll) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="sft_norm"):
        losses.DPOSettings(sft_norm="mean")


# ------------------------------------------------------------------------------------------------- thoughts


@pytest.mark.parametrize(
    "thought, action, names",
    [
        ("Wi-Fi is off but must be on, so next I tap Wi-Fi.", Action("click", target="Wi-Fi"), True),
        ("Wi-Fi is off but must be on, so next I tap Bluetooth.", Action("click", target="Wi-Fi"), True),
        ("So next I tap Bluetooth.", Action("click", target="Wi-Fi"), False),
        ('I must enter "cheap shoes", so I will type "cheap shoes".', Action("type", text="Cheap  Shoes"), True),
        ("The query is typed, so next I press enter.", Action("press", button="enter"), True),
        ("The query is typed, so next I press back.", Action("press", button="enter"), False),
        ("Rows are hidden, next I scroll down.", Action("scroll", direction="down"), True),
        ("The task is complete, so next I stop.", Action("stop"), True),
        ("So next I tap Send.", Action("stop"), False),
        ("", Action("click", target=""), False),
    ],
)
def test_thought_names_action(thought, action, names):
    assert thought_names_action(thought, action) is names


# ------------------------------------------------------------------------------------------------- bootstrap


def test_paired_bootstrap_gain_and_interval():
    from ipl_jax.eval.bootstrap import episode_counts, paired_gain_interval

    seed = [
        {"episode_id": e, "exact_match": m} for e, m in [("a", 1), ("a", 0), ("b", 0), ("b", 0), ("c", 1), ("c", 1)]
    ]
    better = [dict(r, exact_match=1) for r in seed]
    base, other = episode_counts(seed), episode_counts(better)
    assert base == {"a": (1, 2), "b": (0, 2), "c": (2, 2)}
    g = paired_gain_interval([base], [other], n_boot=500, seed=1)
    assert g["gain"] == pytest.approx(3 / 6)  # 3 of 6 steps more
    # resampling 3 episodes: the all-"c" draw (no gain, p = 1/27) can reach the 2.5 % quantile
    assert 0.0 <= g["low"] < g["gain"] < g["high"] <= 1.0 and g["width"] == pytest.approx(g["high"] - g["low"])
    same = paired_gain_interval([base, base], [base, base], n_boot=100)
    assert same["gain"] == same["low"] == same["high"] == 0.0
    # two splits: the mean of their gains
    two = paired_gain_interval([base, base], [other, base], n_boot=100)
    assert two["gain"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="different episodes"):
        paired_gain_interval([base], [{"a": (1, 2)}])


# ------------------------------------------------------------------------------------------------- blank screens


def test_blank_screen_keeps_size_and_replaces_pixels():
    from PIL import Image

    from ipl_jax.data.records import Step
    from ipl_jax.eval.evaluate import BLANK_GREY, blank_screen

    img = Image.new("RGB", (30, 50), (10, 200, 30))
    img.putpixel((3, 3), (255, 0, 0))
    step = Step(
        episode_id="e", step_id=0, instruction="x", image=lambda: img, screen_size=(30, 50), action=Action("stop")
    )
    blank = blank_screen(step)
    out = blank.load_image()
    assert out.size == (30, 50) and set(map(tuple, np.asarray(out).reshape(-1, 3).tolist())) == {BLANK_GREY}
    assert step.load_image().getpixel((3, 3)) == (255, 0, 0)  # the original is untouched
    assert dataclasses.replace(blank, image=None).instruction == "x"


# ------------------------------------------------------------------------------------------------- settings


def _round_config(s, cfg):
    """Round 1's config as the job builds it (``pipeline/rounds_stage.run_round``), pad id 0."""
    return s.ipl.round(cfg, s.model.precision(), s.sft.grad_clip, s.sampler, s.buckets, 0, 1)


def test_ipl_settings_are_typed_and_checked():
    from support.small_models import tiny_cfg

    from ipl_jax.configs.loader import load_settings
    from ipl_jax.settings import SettingsError

    s = load_settings(
        "synthetic",
        [
            "--config.ipl.gamma_pairs=consistent",
            "--config.ipl.selection.dedup=true",
            "--config.ipl.selection.type_balance=1.5",
            "--config.ipl.method=continued_sft",
            "--config.ipl.selection.mix_trees=false",
        ],
    )
    ipl = s.ipl
    assert ipl.gamma_pairs == "consistent" and ipl.selection.dedup is True and ipl.selection.type_balance == 1.5
    assert ipl.lr(1) == ipl.learning_rate and ipl.gamma_cap == ipl.max_pairs_per_tree

    cfg = tiny_cfg()
    rc = _round_config(s, cfg)
    assert rc.gamma_consistent_only and rc.pairs.gamma_action_pairs and rc.train_on == "golden"
    assert rc.selection == PairSelection(dedup=True, type_balance=1.5, mix_trees=False)
    # a T-DPO row holds one step's prefix, so one screenshot: its patch slot is one screenshot's, as the memory
    # plan assumes (the batch's buckets, x rows, made every row's vision tower 8 times the size it needs)
    assert rc.packing.rows == s.ipl.batch_size > 1 and rc.packing.patch_buckets == s.buckets.patches
    g = _round_config(load_settings("synthetic", ["--config.ipl.gamma_pairs=grounding"]), cfg)
    assert not g.pairs.gamma_action_pairs and g.pairs.gamma_grounding_pairs and not g.gamma_consistent_only
    for field, value in (
        ("gamma_pairs", "all"),
        ("learning_rate", "-1e-5"),
        ("method", "sarsa"),
        ("dpo.sft_norm", "mean"),
    ):
        with pytest.raises(SettingsError, match=rf"^config\.ipl\.{field}="):
            load_settings("synthetic", [f"--config.ipl.{field}={value}"])


def test_moved_settings_keep_their_old_names(capsys, monkeypatch):
    """``ipl.beta`` and the selection's switches moved into ``ipl.dpo`` / ``ipl.selection``: the old flag, a variant's
    switch and a recorded config.json still set them, with one line saying where they live now."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.settings import Settings, job
    from ipl_jax.settings.job import relocated

    monkeypatch.setattr(job, "_told", set())  # each old name is told once a process
    s = load_settings("synthetic", ["--config.ipl.beta=0.25", "--config.ipl.mix_trees=false"])
    assert s.ipl.dpo.beta == 0.25 and s.ipl.selection.mix_trees is False
    assert s.replace({"ipl.sft_weight": 0.5}).ipl.dpo.sft_weight == 0.5
    err = capsys.readouterr().err
    assert "config.ipl.beta is config.ipl.dpo.beta now" in err and "config.ipl.sft_weight" in err
    old = {"ipl": {"beta": 0.3, "dedup": False, "rounds": 2}, "seed": 1}
    ipl = Settings.defaults()["ipl"]  # a section the old names move into starts from its defaults
    assert relocated(old, tell=False) == {
        "ipl": {"rounds": 2, "dpo": {**ipl["dpo"], "beta": 0.3}, "selection": {**ipl["selection"], "dedup": False}},
        "seed": 1,
    }
    assert old["ipl"]["beta"] == 0.3  # the caller's dict is left as it was


def test_optimizer_settings_come_from_the_sections():
    """SFT and each IPL round get an ``OptimizerSettings`` made from their settings; the hand-written values
    below are what the sections hold."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.preference.tdpo import IPL_OPTIMIZER, TDPOConfig, round_schedule
    from ipl_jax.training.optimizer import OptimizerSettings

    s = load_settings(
        "synthetic",
        [
            "--config.ipl.learning_rate=3e-6",
            "--config.ipl.later_learning_rate=1e-7",
            "--config.ipl.schedule=cosine",
            "--config.ipl.warmup_steps=5",
            "--config.sft.grad_clip=0.5",
            "--config.sft.steps=40",
            "--config.sft.weight_decay=0.02",
        ],
    )
    want = OptimizerSettings(
        learning_rate=3e-6, schedule="cosine", warmup_steps=5, total_steps=1000, grad_clip_norm=0.5
    )
    assert s.ipl.optimizer(1, s.sft.grad_clip) == want
    assert s.ipl.optimizer(2, s.sft.grad_clip) == dataclasses.replace(want, learning_rate=1e-7)
    assert s.sft.optimizer() == OptimizerSettings(
        learning_rate=s.sft.learning_rate,
        schedule="cosine",
        warmup_steps=s.sft.warmup_steps,
        total_steps=40,
        weight_decay=0.02,
        grad_clip_norm=0.5,
    )
    # the RL learners clip where SFT and T-DPO do
    from ipl_jax.pipeline.rl_round import ppo_config

    ppo = ppo_config(s.rl, s.buckets, object(), 0, s.model.precision(), False, s.sft.grad_clip)
    for made in (ppo.policy_optimizer_settings(), ppo.critic_optimizer_settings()):
        assert made.grad_clip_norm == 0.5 and made.weight_decay == 0.01
    # a round's cosine spans its updates; a constant schedule is left as it is
    cfg = object()
    short = TDPOConfig(model=cfg, optimizer_settings=dataclasses.replace(IPL_OPTIMIZER, learning_rate=2e-6))
    cos = TDPOConfig(model=cfg, optimizer_settings=want)
    assert round_schedule(cos, 7).optimizer_settings.total_steps == 7 and round_schedule(short, 7) is short


@pytest.mark.e2e
def test_eval_blank_screens_equals_a_dataset_of_grey_screenshots(tmp_path):
    """``ipl-jax eval --blank-screens`` on a split gives exactly the predictions of a plain evaluation on a copy of
    the split whose PNGs were painted grey."""
    import json
    import shutil

    pytest.importorskip("torch")
    from PIL import Image

    from ipl_jax.cli.eval import main as eval_main
    from ipl_jax.data.tiny import make_tiny_checkpoint
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
    from ipl_jax.envs.synthetic.dataset import generate_split
    from ipl_jax.eval.evaluate import BLANK_GREY

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", seed=0, scale=4.0)
    write_aitz_split(generate_split("train", 1, seed=3), tmp_path / "data", "test")
    shutil.copytree(tmp_path / "data", tmp_path / "grey")
    for png in (tmp_path / "grey").rglob("*.png"):
        size = Image.open(png).size
        Image.new("RGB", size, BLANK_GREY).save(png)
    outs = {}
    for name, data, extra in (("blank", "data", ["--blank-screens"]), ("grey", "grey", []), ("plain", "data", [])):
        preds = tmp_path / f"{name}.jsonl"
        assert (
            eval_main(
                [
                    "--model",
                    str(ckpt),
                    "--data",
                    str(tmp_path / data),
                    "--format",
                    "aitz",
                    "--split",
                    "test",
                    "--max-turn-tokens",
                    "6",
                    "4",
                    "4",
                    "6",
                    "--predictions",
                    str(preds),
                    *extra,
                ]
            )
            == 0
        )
        outs[name] = [json.loads(x)["turns"] for x in preds.read_text().splitlines()]
    assert outs["blank"] == outs["grey"]
    assert outs["blank"] != outs["plain"]  # the screenshots do reach this (random, scaled) model
