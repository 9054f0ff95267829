"""Greedy CoaT evaluation (``evaluate_policy`` / ``ipl-jax eval``) and ``ipl-jax sample`` on a tiny checkpoint
(transformers-written, with a trained BPE tokenizer) and a synthetic split in the AITZ format."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from support.published_fixtures import tiny_checkpoint_and_data

from ipl_jax import model as M
from ipl_jax.cli.eval import main as eval_main
from ipl_jax.cli.sample import main as sample_main
from ipl_jax.cli.score import main as score_main
from ipl_jax.coat.actions import parse_action
from ipl_jax.data.datasets import load_dataset
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.tokenizer import IM_END, load_tokenizer
from ipl_jax.sampling.prompts import step_prompts

TURN_TOKENS = (8, 6, 6, 8)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_checkpoint_and_data(tmp_path_factory.mktemp("eval"))


def _reference_turns(ckpt, steps):
    """Greedy decoding turn by turn with ``greedy_generate`` on the concatenated dialogue."""
    params, cfg = M.load_params(str(ckpt))
    tok = load_tokenizer(ckpt)
    image_config = ImageProcessorConfig.load(ckpt)
    out = []
    for step in steps:
        sp = step_prompts(step, tok, image_config, cfg)
        seq, turns = list(sp.prefix_ids), []
        for t in range(4):
            if t:
                seq += list(sp.turn_prompt_ids[t - 1])
            inputs = M.prepare_inputs(
                cfg,
                [seq],
                None,
                sp.pixel_values,
                sp.image_grid_thw,
                text_buckets=(256,),
                patch_buckets=(256,),
                pad_id=tok.ids.pad,
            )
            ids, n = M.greedy_generate(params, cfg, inputs, max_new_tokens=max(TURN_TOKENS), eos_ids=tok.ids.eos)
            gen = [int(i) for i in np.asarray(ids[0, : min(int(n[0]), TURN_TOKENS[t])])]
            text = tok.decode(gen)
            turns.append((text[: -len(IM_END)] if text.endswith(IM_END) else text).strip())
            seq += gen
        out.append(turns)
    return out


def _on_test(ckpt, data, steps: int) -> list[str]:
    """The flags of a command that decodes ``ckpt`` on the first ``steps`` test steps of ``data``."""
    turns = ["--max-turn-tokens", *(str(t) for t in TURN_TOKENS)]
    return ["--model", str(ckpt), "--data", str(data), "--split", "test", "--steps", str(steps), *turns]


@pytest.mark.e2e
def test_eval_main_decodes_greedily_and_scores(setup, tmp_path):
    ckpt, data = setup
    preds_path, table_path = tmp_path / "preds.jsonl", tmp_path / "table.json"
    outputs = ["--json", str(table_path), "--predictions", str(preds_path)]
    rc = eval_main([*_on_test(ckpt, data, 3), "--format", "aitz", "--batch-size", "2", *outputs])
    assert rc == 0
    records = [json.loads(line) for line in preds_path.read_text().splitlines()]
    table = json.loads(table_path.read_text())
    steps = [s for ep in load_dataset(data, "aitz", "test") for s in ep.steps][:3]
    assert [(r["episode_id"], r["step_id"]) for r in records] == [(str(s.episode_id), s.step_id) for s in steps]
    # the last batch (1 step + 1 padding row) is dropped from the output, the greedy turns are the reference's
    assert [r["turns"] for r in records] == _reference_turns(ckpt, steps)
    for r, s in zip(records, steps):
        assert r["action"] == parse_action(r["turns"][2], r["turns"][3]).to_json()
        assert r["golden"] == s.action.to_json()
        assert r["exact_match"] <= r["type_match"]
    assert table["total"]["count"] == 3
    assert table["total"]["exact_acc"] == pytest.approx(sum(r["exact_match"] for r in records) / 3)
    assert table["total"]["type_acc"] == pytest.approx(sum(r["type_match"] for r in records) / 3)
    # the predictions file is re-scorable by `ipl-jax score` (missing steps of the split count as misses there)
    rescored = tmp_path / "rescored.json"
    assert (
        score_main(
            [
                "--data",
                str(data),
                "--format",
                "aitz",
                "--split",
                "test",
                "--predictions",
                str(preds_path),
                "--json",
                str(rescored),
            ]
        )
        == 0
    )
    n_all = json.loads(rescored.read_text())["total"]["count"]
    assert json.loads(rescored.read_text())["total"]["exact_acc"] * n_all == pytest.approx(
        table["total"]["exact_acc"] * 3
    )


@pytest.mark.e2e
def test_sample_main_writes_trees_and_viewer(setup, tmp_path):
    ckpt, data = setup
    out, page = tmp_path / "trees.jsonl", tmp_path / "trees.html"
    sampling = ["--branching", "2", "1", "2", "1", "--batch-size", "2", "--temperature", "1.0"]
    rc = sample_main([*_on_test(ckpt, data, 2), "--out", str(out), "--html", str(page), *sampling])
    assert rc == 0
    trees = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(trees) == 2
    for tr in trees:
        assert tr["branching"] == [2, 1, 2, 1] and len(tr["leaf_values"]) == 4
        leaves = []

        def walk(node, depth):
            assert node["turn"] == depth
            if depth == 4:
                leaves.append(node)
                assert node["action"] == parse_action(parent_s3[-1], node["text"]).to_json()
                return node["value"]
            if depth == 3:
                parent_s3.append(node["text"])
            vals = [walk(c, depth + 1) for c in node["children"]]
            assert node["value"] == pytest.approx(0.95 * np.mean(vals), abs=1e-6)  # value backup
            return node["value"]

        parent_s3: list = []
        top = [walk(c, 1) for c in tr["children"]]
        assert tr["root_value"] == pytest.approx(0.95 * np.mean(top), abs=1e-6)
        assert [lf["value"] for lf in leaves] == pytest.approx(tr["leaf_values"])
        ones = sum(v >= 1 - 1e-6 for v in tr["leaf_values"])
        assert tr["class"] == ("alpha" if ones == 4 else "beta" if ones else "gamma")
        assert all(0.0 <= v <= 1.0 for v in tr["leaf_values"])
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 2 and html.count("<section>") == 2
    assert "s3 action" in html
