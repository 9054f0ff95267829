"""A round's diagnostics on hand-made pairs and trees: preference accuracy and margins before / after the update
(``preference.diagnostics``), sampled pass@1, thought -> action consistency and thoughts naming the golden action
(``eval.trees.LeafTally``), and how they print (``pipeline.report``) and reach TensorBoard."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from support.trees import assert_trees_equal

from ipl_jax.coat.actions import Action, invalid_action
from ipl_jax.eval.trees import LeafTally, leaf_consistency, row_tallies
from ipl_jax.preference.diagnostics import PairLogps, attached_logps, pair_figures

# four pairs (the last one padding), turns 2, 3, 3 (and 2); summed log-probs under π(n-1) ("start") and π(n)
START = PairLogps(
    pos=np.array([-2.0, -5.0, -1.0, -9.0], np.float32),
    neg=np.array([-3.0, -4.0, -1.0, -9.0], np.float32),
    valid=np.array([True, True, True, False]),
    turn=np.array([2, 3, 3, 2], np.int32),
)
END = PairLogps(
    pos=np.array([-1.0, -3.0, -2.0, 0.0], np.float32),
    neg=np.array([-4.0, -4.0, -1.0, 0.0], np.float32),
    valid=START.valid,
    turn=START.turn,
)


def test_pair_figures_on_hand_made_log_probs():
    """By hand: margins before [1, -1, 0] (the tie counts as wrong), after [3, 1, -1]; implicit rewards
    0.1 x [(1) - (-1), (2) - (0), (-1) - (0)] = [0.2, 0.2, -0.1]; the padding pair counts nowhere."""
    f = pair_figures(START, END, beta=0.1)
    assert f["pairs"] == 3
    assert f["accuracy_before"] == pytest.approx(1 / 3) and f["logp_margin_before"] == pytest.approx(0.0)
    assert f["accuracy_after"] == pytest.approx(2 / 3) and f["logp_margin_after"] == pytest.approx(1.0)
    assert f["reward_margin"] == pytest.approx(0.1) and f["reward_accuracy"] == pytest.approx(2 / 3)
    t2, t3 = f["by_turn"]["2"], f["by_turn"]["3"]
    assert set(f["by_turn"]) == {"2", "3"} and t2["pairs"] == 1 and t3["pairs"] == 2
    assert (t2["accuracy_before"], t2["accuracy_after"], t2["reward_margin"]) == pytest.approx((1.0, 1.0, 0.2))
    assert (t3["accuracy_before"], t3["accuracy_after"]) == pytest.approx((0.0, 0.5))
    assert (t3["reward_margin"], t3["reward_accuracy"]) == pytest.approx((0.05, 0.5))
    # the same weights before and after: the policy's own preference is unchanged and no pair gains a reward
    same = pair_figures(START, START, beta=0.1)
    assert same["accuracy_after"] == same["accuracy_before"] and same["reward_margin"] == 0.0
    assert same["reward_accuracy"] == 0.0
    empty = PairLogps.concat([])
    assert pair_figures(empty, empty, 0.1) == {
        "pairs": 0,
        **dict.fromkeys(
            (
                "accuracy_before",
                "accuracy_after",
                "logp_margin_before",
                "logp_margin_after",
                "reward_accuracy",
                "reward_margin",
            )
        ),
        "by_turn": {},
    }
    with pytest.raises(ValueError, match="same pairs"):
        pair_figures(START, PairLogps.concat([END, END]), 0.1)


def test_attached_log_probs_are_read_from_the_batches_in_order():
    b1 = types.SimpleNamespace(
        ref_pos=START.pos[:2], ref_neg=START.neg[:2], pair_valid=START.valid[:2], pair_turn=[2, 3]
    )
    b2 = types.SimpleNamespace(
        ref_pos=START.pos[2:], ref_neg=START.neg[2:], pair_valid=START.valid[2:], pair_turn=[3, 2]
    )
    got = attached_logps([b1, b2])
    assert_trees_equal(dataclasses.asdict(got), dataclasses.asdict(START))


GOLDEN = Action("click", point=(0.5, 0.2), box=(0.4, 0.15, 0.6, 0.25), target="Wi-Fi")
# one tree with branching (2, 2, 2, 1): thoughts [2, 2] and their leaves [2, 2, 2, 1]
THOUGHTS = [["Tap Wi-Fi to turn it on.", "Scroll down to find it."], ["I should go back.", "Nothing to do here."]]
LEAVES = [
    [
        [Action("click", target="Wi-Fi"), Action("scroll", direction="down")],
        [Action("scroll", direction="down"), Action("scroll", direction="up")],
    ],
    [[Action("press", button="back"), Action("press", button="home")], [Action("stop"), invalid_action()]],
]


def _tree(rows: int):
    thoughts = np.empty((rows, 2, 2), object)
    actions = np.empty((rows, 2, 2, 2, 1), object)
    for r in range(rows):
        for i, j in np.ndindex(2, 2):
            thoughts[r, i, j] = THOUGHTS[i][j]
            for k in range(2):
                actions[r, i, j, k, 0] = LEAVES[i][j][k]
    exact = np.zeros(actions.shape, bool)
    exact[:, 0, 0, 0, 0] = True  # the click on Wi-Fi (the rules' verdict, given here)
    return thoughts, actions, exact


def test_leaf_tally_of_a_hand_made_tree():
    """Consistent leaves: the click under "Tap Wi-Fi", the scroll down under "Scroll down", the press back under
    "go back" (3 of 8); the scroll up, the press home, a stop under "Nothing to do" and an unparsed action are not.
    One thought of four names the golden click; one leaf of eight is exact. The padding row counts nowhere."""
    thoughts, actions, exact = _tree(2)
    consistent = leaf_consistency(thoughts, actions)
    want = np.zeros((2, 2, 2, 1), bool)
    want[0, 0, 0, 0] = want[0, 1, 0, 0] = want[1, 0, 0, 0] = True
    np.testing.assert_array_equal(consistent[0], want)
    steps = [types.SimpleNamespace(action=GOLDEN)] * 2
    texts = [None, thoughts, None, None]
    tallies = row_tallies(texts, actions, exact, steps, np.array([True, False]))
    assert tallies[1] is None
    assert tallies[0] == LeafTally(leaves=8, exact=1, consistent=3, thoughts=4, naming_golden=1)
    assert tallies[0].figures() == pytest.approx(
        {"pass_at_1": 1 / 8, "consistency": 3 / 8, "thought_names_golden": 1 / 4}
    )
    both = tallies[0] + LeafTally(leaves=8, exact=3, consistent=8, thoughts=4, naming_golden=4)
    assert both.figures() == pytest.approx({"pass_at_1": 0.25, "consistency": 11 / 16, "thought_names_golden": 5 / 8})
    assert LeafTally().figures() == {"pass_at_1": None, "consistency": None, "thought_names_golden": None}


DIAG = {
    "train_pairs": {"pairs": 3, **pair_figures(START, END, 0.1)},
    "heldout_pairs": {**pair_figures(START, START, 0.1), "trees": 2},
    "train_steps": {
        "steps": 4,
        "pass_at_1_before": 0.125,
        "pass_at_1_after": 0.25,
        "greedy_before": 0.5,
        "greedy_after": 0.75,
        "consistency_before": 0.375,
        "consistency_after": None,
    },
}


def test_round_table_and_ablation_print_the_diagnostics():
    from ipl_jax.pipeline.ablate import format_ablation
    from ipl_jax.pipeline.report import results_round, round_table

    tables = {"test": {"total": {"count": 4, "type_acc": 0.5, "exact_acc": 0.25}}}
    r0 = results_round(0, tables, {}, 0, 1.0)
    r1 = results_round(1, tables, {}, 3, 2.0, diagnostics=DIAG)
    lines = round_table([r0, r1], "test").splitlines()
    rows = {line[:18].strip(): line[18:].split() for line in lines[2:]}
    assert rows["train pairs acc"] == ["-", "33->67"]
    assert "train logp margin" not in rows  # in the ablation's wider table and results.json
    assert rows["train rew margin"] == ["-", "+0.10"]
    assert rows["held-out acc"] == ["-", "33->33"] and rows["held-out rew m."] == ["-", "+0.00"]
    assert rows["pass@1 (train)"] == ["-", "12->25"] and rows["greedy (train)"] == ["-", "50->75"]
    assert rows["consistency"] == ["-", "38->-"]
    assert "train pairs acc" not in round_table([r0], "test")  # no round with diagnostics: no rows
    result = {
        "splits": ["test"],
        "rounds": 2,
        "rows": [
            {"variant": "start", "metrics": tables},
            {
                "variant": "tdpo",
                "metrics": tables,
                "diagnostics": [DIAG, {"train_steps": {"greedy_before": 0.75, "greedy_after": 1.0}}],
            },
        ],
    }
    block = format_ablation(result).split("what each round did")[1].splitlines()
    assert block[3].split()[:4] == ["tdpo", "1", "33->67", "+0.00->+1.00"]
    assert block[4].split()[:3] == ["tdpo", "2", "-"] and "75->100" in block[4].split()


def test_diagnostics_reach_tensorboard_scalars():
    from ipl_jax.viz.tensorboard_log import round_scalars

    got = round_scalars({"round": 1, "diagnostics": DIAG})
    assert got["diagnostics/train_pairs/reward_margin"] == pytest.approx(0.1)
    assert got["diagnostics/train_steps/greedy_after"] == 0.75 and got["diagnostics/heldout_pairs/trees"] == 2
    assert "diagnostics/train_steps/consistency_after" not in got  # None: no tag
