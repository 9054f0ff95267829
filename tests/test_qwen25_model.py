"""Qwen2.5-VL against transformers' ``Qwen2_5_VLForConditionalGeneration`` on tiny random checkpoints: logits
(float32, max |difference| <= 1e-4, weights scaled so logits are far from zero) for images whose merged grid is
not a multiple of the attention window, exactly a multiple, and smaller than one; the window bookkeeping; M-RoPE
positions; greedy decoding through our KV cache against ``generate``; the exported directory loading back in
transformers; the tiny-checkpoint tool with ``check-parity``."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.hf_models import (  # noqa: E402
    TEXT_IDS,
    VISION_IDS,
    assert_logits_close,
    assert_rope_index_matches,
    hf_forward,
    hf_greedy,
    left_pad,
    random_hf_model,
    random_image,
    sample_tokens,
    saved_models,
)
from support.trees import assert_trees_equal  # noqa: E402

from ipl_jax.model.config import Qwen2VLConfig  # noqa: E402
from ipl_jax.model.decode import greedy_generate  # noqa: E402
from ipl_jax.model.inputs import prepare_inputs, prepare_vision  # noqa: E402
from ipl_jax.model.text import forward_inputs  # noqa: E402
from ipl_jax.model.vision25 import window_index_host, window_order  # noqa: E402
from ipl_jax.model.weights import load_params, save_params  # noqa: E402

PATCH_DIM = 3 * 2 * 14 * 14
VOCAB = 1000
TOL = 1e-4

# "win2": a 56-pixel window (2x2 merged tokens) so small images span many windows; 3 blocks, block 1 attends over
# whole images; untied, 2 query heads per KV head. "win4": the real 112-pixel window (4x4 merged); block 0 full;
# tied embeddings, 4 query heads per KV head.
CONFIGS = {
    "win2": dict(window=56, depth=3, fullatt=[1], tie=False, kv_heads=2, seed=0),
    "win4": dict(window=112, depth=2, fullatt=[0], tie=True, kv_heads=1, seed=1),
}
# Image grids (t, h, w) in patches. Merged grids: win2 5x3, 4x4, 2x3, 3x2 (window 2); win4 5x6, 4x4, 2x3, 9x2
# (window 4): cut edge windows in one or both directions, an exact multiple (transformers pads a whole empty window
# there), and images smaller than a window. Rows: images 0-1 in row 0, images 2-3 in row 1 (left-padded).
GRIDS = {
    "win2": [[1, 10, 6], [1, 8, 8], [1, 4, 6], [1, 6, 4]],
    "win4": [[1, 10, 12], [1, 8, 8], [1, 4, 6], [1, 18, 4]],
}
PATCH_BUCKET = {"win2": 192, "win4": 320}  # leaves pad patches after the images


def tiny25_model(window: int, depth: int, fullatt, tie: bool, kv_heads: int, seed: int, scale: float = 8.0):
    """A random Qwen2_5_VLForConditionalGeneration (eager, float32): weights x ``scale``, biases and norm weights
    random (transformers starts them at 0 and 1, which would hide bias and norm bugs)."""
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=kv_heads,
            **TEXT_IDS,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
        ),
        vision_config=dict(
            depth=depth,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            window_size=window,
            fullatt_block_indexes=list(fullatt),
            tokens_per_second=2,
        ),
        **VISION_IDS,
        tie_word_embeddings=tie,
    )
    return random_hf_model(transformers.Qwen2_5_VLForConditionalGeneration, config, seed, scale)


def batch(name: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    grids = GRIDS[name]
    pv = np.concatenate([random_image(rng, tuple(g[1:]), PATCH_DIM)[0] for g in grids])
    ids, mask = left_pad([sample_tokens(rng, 5, grids[:2], 4, VOCAB), sample_tokens(rng, 2, grids[2:], 3, VOCAB)])
    return ids, mask, pv, grids


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return saved_models(tmp_path_factory, tiny25_model, CONFIGS)


pytestmark = pytest.mark.usefixtures("highest_precision")


def cfg25(window: int) -> Qwen2VLConfig:
    return Qwen2VLConfig.from_hf_dict(
        {
            "model_type": "qwen2_5_vl",
            "text_config": {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "rope_parameters": {"mrope_section": [2, 3, 3]},
            },
            "vision_config": {"window_size": window, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2},
        }
    )


def test_window_index_matches_transformers():
    from transformers.vision_utils import get_vision_window_index

    # The documented example: grid 1x12x20 in 112-pixel windows (4x4 merged tokens).
    assert window_index_host([[1, 12, 20]], cfg25(112))[1].tolist() == [0, 64, 128, 160, 192, 224, 240]
    cases = [
        (112, [[1, 24, 40]]),
        (112, [[1, 10, 12], [1, 8, 8], [2, 4, 6], [1, 18, 4]]),
        (56, [[1, 10, 6], [1, 8, 8], [1, 2, 2]]),
    ]
    for window, grids in cases:
        cfg = cfg25(window)
        ref_index, ref_cu = get_vision_window_index(torch.as_tensor(grids), 2, window, 14)
        index, cu = window_index_host(grids, cfg)
        np.testing.assert_array_equal(index, ref_index.numpy())
        np.testing.assert_array_equal(cu, ref_cu.numpy())
        # On device, from padded packed patches (2 pad groups): the same order, the same windows, a true inverse.
        n = int(np.sum(np.prod(grids, axis=1)))
        vis = prepare_vision(cfg, np.zeros((n, PATCH_DIM), np.float32), grids, patch_buckets=(n + 8,))
        perm, inverse, window_ids = (np.asarray(a) for a in window_order(vis.pos_hw, vis.segment_ids, cfg))
        m = n // 4
        np.testing.assert_array_equal(perm, np.concatenate([index, [m, m + 1]]))  # the pad groups stay last
        np.testing.assert_array_equal(perm[inverse], np.arange(m + 2))
        bounds = np.append(np.flatnonzero(np.diff(window_ids, prepend=-1)) * 4, n + 8)  # window edges, in patches
        np.testing.assert_array_equal(bounds, np.append(cu, n + 8))  # the pads: one window after the images


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(models, name):
    model_dir, hf_model = models[name]
    ids, mask, pv, grids = batch(name)
    ref = hf_forward(hf_model, ids, mask, pv, grids)
    params, cfg = load_params(model_dir)
    assert cfg.model_type == "qwen2_5_vl" and cfg.tie_word_embeddings == CONFIGS[name]["tie"]
    assert cfg.vision.fullatt_block_indexes == tuple(CONFIGS[name]["fullatt"])
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET[name],))
    ours = np.asarray(forward_inputs(params, cfg, inputs))[:, : ids.shape[1]]
    assert_logits_close(f"qwen2.5-vl {name}", ours, ref, mask, TOL)


def test_rope_index_matches_transformers(models):
    """For images, Qwen2.5-VL's positions are Qwen2-VL's (the video time scale does not apply)."""
    model_dir, hf_model = models["win4"]
    ids, mask, _, grids = batch("win4")
    cfg = Qwen2VLConfig.from_dir(model_dir)
    assert_rope_index_matches(hf_model, cfg, ids, mask, grids)


def test_rows_under_vmap_with_query_chunks(models):
    """Packed training batches encode each row's images under ``vmap`` (the window sort included), with attention
    in query chunks: the same features as one row at a time without chunks."""
    from ipl_jax.model.vision import encode_images, encode_images_unjitted

    params, cfg = load_params(models["win2"][0])
    rng = np.random.default_rng(4)
    rows = []
    for grids in ([[1, 10, 6], [1, 4, 6]], [[1, 8, 8]]):
        pv = np.concatenate([random_image(rng, tuple(g[1:]), PATCH_DIM)[0] for g in grids])
        rows.append(prepare_vision(cfg, pv, grids, patch_buckets=(96,)))
    single = [np.asarray(encode_images(params, cfg, v)) for v in rows]
    chunked = cfg.replace(attention_query_chunk=24)
    stacked = jax.tree.map(lambda *a: np.stack(a), *rows)
    both = np.asarray(jax.jit(jax.vmap(lambda v: encode_images_unjitted(params, chunked, v)))(stacked))
    for i, n_merged in enumerate((21, 16)):
        assert np.abs(single[i][:n_merged]).std() > 0.5
        np.testing.assert_allclose(both[i][:n_merged], single[i][:n_merged], atol=1e-4, rtol=0)


@pytest.mark.e2e
def test_greedy_matches_transformers_generate(models):
    model_dir, hf_model = models["win2"]
    ids, mask, pv, grids = batch("win2", seed=3)
    ref = hf_greedy(hf_model, ids, mask, pv, grids, max_new_tokens=24)
    params, cfg = load_params(model_dir)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET["win2"],))
    tokens, n = greedy_generate(params, cfg, inputs, max_new_tokens=24)
    assert len(set(ref[0].tolist())) > 3  # not a degenerate repeat of one token
    np.testing.assert_array_equal(np.asarray(tokens), ref)
    assert np.asarray(n).tolist() == [24, 24]


def test_export_loads_in_transformers(models, tmp_path):
    model_dir, hf_model = models["win4"]
    params, cfg = load_params(model_dir)
    save_params(params, cfg, str(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert saved["vision_config"]["hidden_size"] == 32 and saved["vision_config"]["out_hidden_size"] == 64
    assert Qwen2VLConfig.from_dir(tmp_path) == cfg
    loaded = transformers.AutoModelForImageTextToText.from_pretrained(
        str(tmp_path), attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(loaded).__name__ == "Qwen2_5_VLForConditionalGeneration"
    ids, mask, pv, grids = batch("win4", seed=5)
    valid = mask.astype(bool)
    ref, got = hf_forward(hf_model, ids, mask, pv, grids), hf_forward(loaded, ids, mask, pv, grids)
    assert np.max(np.abs(got - ref)[valid]) <= 1e-6
    theirs = {name: tensor.numpy() for name, tensor in loaded.state_dict().items()}
    assert_trees_equal(theirs, {name: tensor.numpy() for name, tensor in hf_model.state_dict().items()})


def test_make_tiny_then_check_parity(tmp_path, capsys):
    from ipl_jax.cli import main as cli_main

    out = tmp_path / "tiny25"
    assert cli_main(["make-tiny", "--arch", "qwen2_5_vl", "--scale", "8", "--out", str(out)]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "qwen2_5_vl"
    assert saved["vision_config"]["fullatt_block_indexes"] == [1] and saved["vision_config"]["window_size"] == 112
    capsys.readouterr()
    rc = cli_main(["check-parity", "--model", str(out)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(f"check-parity on make-tiny --arch qwen2_5_vl: {res}")
    assert rc == 0 and res["ok"] is True
    assert res["logit_std"] >= 0.5 and res["max_abs_logit_diff"] <= TOL
