"""``synthetic:gpu``: a 20-50M-parameter policy that reads the world's screenshots at full resolution, three
rounds of more sampled steps; and a CPU smoke run of the whole job on it with its sizes cut (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from ipl_jax.configs.loader import load_settings

REPO = Path(__file__).resolve().parent.parent


def test_gpu_config_is_a_20_to_50m_policy_that_sees_full_resolution_screens():
    from ipl_jax.data.image_processing import smart_resize
    from ipl_jax.data.tokenizer import SPECIAL_TOKENS
    from ipl_jax.model import init_params
    from ipl_jax.pipeline.sources import check_job

    c, default = load_settings("synthetic:gpu"), load_settings("synthetic")
    check_job(c)
    ids = {s: c.model.text.vocab_size - len(SPECIAL_TOKENS) + i for i, s in enumerate(SPECIAL_TOKENS)}
    cfg = c.model.fresh_config(ids)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert 20e6 <= n <= 50e6, n
    world = c.world
    # the screenshot is not scaled: its own size, in whole 28-pixel tokens, is what the processor keeps
    h, w = smart_resize(world.height, world.width, 28, int(c.model.min_pixels), int(c.model.max_pixels))
    assert (h, w) == (world.height, world.width)
    patches = (h // 14) * (w // 14)
    assert max(c.buckets.patches) >= patches == 512 and c.model.max_pixels == world.height * world.width
    assert c.ipl.rounds == c.ablation.rounds == 3 and c.ipl.steps_per_round > default.ipl.steps_per_round
    assert set(c.ablation.variants) == {"tdpo", "continued_sft", "no_negatives"}


CUT = [
    "--config.data.train_episodes=10",
    "--config.data.dev_episodes=2",
    "--config.data.test_episodes=2",
    "--config.data.test_splits=test",
    "--config.evolution.max_items=16",
    "--config.model.text.num_hidden_layers=2",
    "--config.model.vision.depth=1",
    "--config.buckets.tokens=(480,)",
    "--config.sampler.tree.prefix_buckets=(192,)",
    "--config.sampler.tree.prompt_buckets=(192,)",
    "--config.ipl.text_buckets=(768,)",
    "--config.sft.steps=4",
    "--config.sft.batch_size=2",
    "--config.sft.micro_batch_size=2",
    "--config.sft.checkpoint_every=2",
    "--config.sft.warmup_steps=1",
    "--config.start_selection.steps=2",
    "--config.start_selection.embedder=tfidf",
    "--config.sampler.tree.branching=(2,2,2,1)",
    "--config.sampler.batch_size=2",
    "--config.eval.batch_size=2",
    "--config.ipl.rounds=2",
    "--config.ipl.steps_per_round=2",
    "--config.ipl.batch_size=2",
    "--config.ipl.diagnostic_steps=2",
    "--config.ipl.heldout_steps=2",
    "--config.ipl.gamma_pairs=paper",
    "--config.ipl.early_stop=false",
]


@pytest.mark.slow
def test_gpu_config_runs_end_to_end_on_a_cpu_with_its_sizes_cut(tmp_path):
    """``ipl-jax run --config synthetic:gpu`` with fewer layers, episodes and steps: every stage runs on the
    full-resolution screenshots in bfloat16; only the last of the two rounds is evaluated on the test split."""
    workdir = tmp_path / "gpu"
    env = dict(os.environ, PYTHONPATH=str(REPO), IPL_JAX_QUIET="1")
    args = [sys.executable, "-m", "ipl_jax.cli", "run", "--config", "synthetic:gpu", "--workdir", str(workdir), *CUT]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = json.loads((workdir / "results.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[1]["metrics"] == {} and set(rounds[2]["metrics"]) == {"test"}  # eval.every_round = false
    assert all(r["diagnostics"]["train_steps"]["steps"] == 2 for r in rounds[1:])
    pre = json.loads((workdir / "export" / "preprocessor_config.json").read_text())
    assert pre["max_pixels"] == pre["min_pixels"] == 224 * 448
    predictions = (workdir / "eval" / "round_2" / "test.predictions.jsonl").read_text().splitlines()
    assert len(predictions) == rounds[2]["metrics"]["test"]["steps"] > 0
