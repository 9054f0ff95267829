"""The starting policy's selection (docs/method.md §9): known-answer tests for TF-IDF, sibling std, Div_R, the choice
rule, and Acc_S / Div_R / tree classes of handcrafted trees pushed through the real decode -> parse -> reward chain."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ipl_jax.data.records import sample_steps
from ipl_jax.eval import embeddings
from ipl_jax.eval import start_selection as sel
from ipl_jax.pipeline.eval_stage import start_scoring


def test_tfidf_known_answer():
    emb = embeddings.tfidf_embed(["click wifi", "click bluetooth", ""])
    # vocabulary in order of appearance: click, wifi, bluetooth; N = 3 documents
    idf_click = math.log(4 / 3) + 1.0  # df 2
    idf_rare = math.log(4 / 2) + 1.0  # df 1
    row0 = np.array([idf_click, idf_rare, 0.0])
    row1 = np.array([idf_click, 0.0, idf_rare])
    np.testing.assert_allclose(emb[0], row0 / np.linalg.norm(row0), rtol=1e-6)
    np.testing.assert_allclose(emb[1], row1 / np.linalg.norm(row1), rtol=1e-6)
    np.testing.assert_array_equal(emb[2], np.zeros(3))


def test_embed_texts_deduplicates_and_keeps_order():
    texts = ["b a", "a", "b a", "c"]
    emb = embeddings.embed_texts(texts, "tfidf")
    assert emb.shape[0] == 4
    np.testing.assert_array_equal(emb[0], emb[2])
    assert not np.allclose(emb[0], emb[1])


def test_sibling_std_and_tree_diversity_known_answer():
    # one tree, branching (2, 1, 2, 1), embeddings in 2-d
    e1 = np.array([[[[0.0, 0.0], [2.0, 4.0]]]])  # [B=1, b1=2, D=2] -> reshape below
    level1 = e1.reshape(1, 2, 2)
    level2 = np.ones((1, 2, 1, 2))  # branching 1: left out
    level3 = np.array([[[[[1.0, 0.0], [1.0, 0.0]]], [[[0.0, 0.0], [0.0, 6.0]]]]])  # [1, 2, 1, 2, D]
    level4 = np.zeros((1, 2, 1, 2, 1, 2))
    # turn 1: std over the 2 siblings per dim = (1, 2) -> mean 1.5
    # turn 3: parent (0,0): siblings equal -> 0; parent (1,0): std (0, 3) -> 1.5; mean over parents 0.75
    div = sel.tree_diversity([level1, level2, level3, level4], (2, 1, 2, 1))
    np.testing.assert_allclose(div, [(1.5 + 0.75) / 2])
    assert sel.sibling_std(np.ones((3, 4, 5))).tolist() == [0.0, 0.0, 0.0]


def test_choose_rule():
    a = sel.CandidateScore("a", acc_s=0.50, div_r=0.02, leaves=10, trees=1)
    b = sel.CandidateScore("b", acc_s=0.45, div_r=0.10, leaves=10, trees=1)
    c = sel.CandidateScore("c", acc_s=0.52, div_r=0.01, leaves=10, trees=1)
    # w = 0.1: a 0.5 + 0.02, b 0.45 + 0.1, c 0.52 + 0.01 -> b
    assert sel.choose([a, b, c], 0.1) == 1
    assert [round(s.score, 6) for s in (a, b, c)] == [0.52, 0.55, 0.53]
    # w = 0: accuracy alone -> c
    assert sel.choose([a, b, c], 0.0) == 2
    # ties go to the earlier candidate
    d = sel.CandidateScore("d", acc_s=0.52, div_r=0.01, leaves=10, trees=1)
    assert sel.choose([c, d], 0.1) == 0


def test_sample_steps_is_seeded_and_ordered():
    steps = list(range(50))
    a = sample_steps(steps, 10, seed=3)
    assert a == sorted(a) and len(set(a)) == 10
    assert a == sample_steps(steps, 10, seed=3)
    assert a != sample_steps(steps, 10, seed=4)
    assert sample_steps(steps, 0, seed=3) == steps


# ----------------------------------------------------------------------------------- the whole scoring chain


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer, write_tokenizer
    from ipl_jax.data.tokenizer import load_tokenizer

    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(train_tokenizer(default_corpus(n_lines=300), 600), d)
    return load_tokenizer(d)


def _step(i: int, action):
    from ipl_jax.data.records import Step, UIElement

    return Step(
        episode_id=str(100 + i),
        step_id=0,
        instruction="open settings",
        image=b"",
        screen_size=(200, 400),
        action=action,
        elements=(UIElement(box=(0.1, 0.1, 0.5, 0.2), text="Settings"),),
    )


def _fake_batches(tokenizer, texts_per_tree, branching):
    """A SampledBatch-like object whose token arrays decode to the given texts (per tree: 4 lists by level,
    row-major node order)."""
    from ipl_jax.coat.tree import NUM_TURNS

    b = len(texts_per_tree)
    tokens, lengths = [], []
    for t in range(NUM_TURNS):
        shape = (b,) + tuple(branching[: t + 1])
        seqs = [[tokenizer.encode(x + "<|im_end|>") for x in tree[t]] for tree in texts_per_tree]
        width = max(len(s) for tree in seqs for s in tree)
        arr = np.zeros((b, len(seqs[0]), width), np.int32)
        lens = np.zeros((b, len(seqs[0])), np.int32)
        for i, tree in enumerate(seqs):
            for j, s in enumerate(tree):
                arr[i, j, : len(s)] = s
                lens[i, j] = len(s)
        tokens.append(arr.reshape(shape + (width,)))
        lengths.append(lens.reshape(shape))
    return SimpleNamespace(tokens=tuple(tokens), lengths=tuple(lengths), step_valid=np.ones(b, bool))


def test_score_candidates_on_handcrafted_trees(tokenizer, monkeypatch):
    from ipl_jax.coat.actions import Action
    from ipl_jax.configs.loader import load_settings

    branching = (2, 1, 2, 1)
    good_box = "<|box_start|>(200,120),(400,180)<|box_end|>"  # centre (0.3, 0.15): inside Settings
    far_box = "<|box_start|>(800,800),(900,900)<|box_end|>"
    golden = Action("click", point=(0.3, 0.15), box=(0.1, 0.1, 0.5, 0.2), target="Settings")
    steps = [_step(0, golden), _step(1, Action("press", button="back"))]
    # tree 0 (golden click): leaves = click good | click far | click good | scroll down -> 2 of 4 exact (beta)
    tree0 = [
        ["screen a", "screen b"],
        ["think", "think"],
        ["click Settings", "click Settings", "click Settings", "scroll down"],
        [good_box, far_box, good_box, ""],
    ]
    # tree 1 (golden press back): no leaf presses back -> gamma; identical s1 siblings
    tree1 = [["same", "same"], ["x", "y"], ["stop", "stop", "press home", "stop"], ["", "", "", ""]]
    fake = _fake_batches(tokenizer, [tree0, tree1], branching)

    def fake_iter(policy, steps_, sconfig, seed, batch_size, mesh=None):
        yield SimpleNamespace(tree=fake, steps=list(steps_), prompts=[None] * len(steps_), start=0)

    monkeypatch.setattr(sel, "iter_tree_batches", fake_iter)
    settings = load_settings("synthetic:quick", ["--config.sampler.tree.branching=(2,1,2,1)"])
    policy = SimpleNamespace(tokenizer=tokenizer)
    scores, kind = sel.score_candidates(
        [("p", policy)], steps, **start_scoring(settings), embedder="tfidf", echo=lambda _: None
    )
    (s,) = scores
    assert kind == "tfidf" and s.leaves == 8 and s.trees == 2
    assert s.acc_s == pytest.approx(2 / 8)
    assert (s.alpha, s.beta, s.gamma) == (0.0, 0.5, 0.5)
    # Div_R by hand with the same TF-IDF space
    texts = [x for tree in (tree0, tree1) for level in tree for x in level]
    table = embeddings.tfidf_embed(sorted(set(texts)))
    index = {t: i for i, t in enumerate(sorted(set(texts)))}

    def div(tree):
        e1 = table[[index[x] for x in tree[0]]]
        e3 = table[[index[x] for x in tree[2]]].reshape(2, 2, -1)
        turn1 = np.std(e1, axis=0).mean()
        turn3 = np.std(e3, axis=1).mean(axis=-1).mean()
        return (turn1 + turn3) / 2

    assert s.div_r == pytest.approx((div(tree0) + div(tree1)) / 2, rel=1e-5)
