"""Forward parity of the JAX Qwen2-VL with transformers, known-answer checks of the host-side position code,
config layouts, and compilation counting."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from support import IMAGE, VISION_END, VISION_START
from support.compiles import count_traces
from support.hf_models import hf_forward, save_tiny, two_image_batch

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import get_rope_index, prepare_inputs, vision_position_ids, vision_segment_ids
from ipl_jax.model.rope import mrope_section_rows
from ipl_jax.model.text import forward_inputs
from ipl_jax.model.weights import load_params

PATCH_DIM = 3 * 2 * 14 * 14

# Three tiny configurations: grouped-query (2 query heads per KV head) untied; no grouping and tied
# embeddings; 4 query heads per KV head, tied, 3 layers, 1 vision block with 4 heads.
CONFIGS = {
    "gqa2_untied": dict(tie=False, heads=4, kv_heads=2),
    "mha_tied": dict(tie=True, heads=4, kv_heads=4),
    "gqa4_tied_3layers": dict(tie=True, heads=8, kv_heads=2, layers=3, vision_depth=1, vision_heads=4),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for i, (name, kw) in enumerate(CONFIGS.items()):
        out[name] = save_tiny(tmp_path_factory.mktemp(name), seed=i, **kw)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(checkpoints, name):
    model_dir, hf_model = checkpoints[name]
    ids, mask, pv, grids = two_image_batch(np.random.default_rng(1), PATCH_DIM, 1000)
    ref = hf_forward(hf_model, ids, mask, pv, grids)
    params, cfg = load_params(model_dir)
    assert cfg.tie_word_embeddings == CONFIGS[name]["tie"]
    assert ("lm_head" in params) != cfg.tie_word_embeddings
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(64,), patch_buckets=(96,))
    with jax.default_matmul_precision("highest"):
        ours = np.asarray(forward_inputs(params, cfg, inputs))[:, : ids.shape[1]]
    valid = mask.astype(bool)
    assert ref[valid].std() >= 0.5
    assert np.max(np.abs(ours - ref)[valid]) <= 1e-4


def test_query_chunked_attention_matches_transformers(checkpoints):
    """Attention processed 24 queries at a time (text 64 and patches 96: one ragged, one even split)."""
    model_dir, hf_model = checkpoints["gqa2_untied"]
    ids, mask, pv, grids = two_image_batch(np.random.default_rng(1), PATCH_DIM, 1000)
    ref = hf_forward(hf_model, ids, mask, pv, grids)
    params, cfg = load_params(model_dir)
    cfg = cfg.replace(attention_query_chunk=24)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(64,), patch_buckets=(96,))
    with jax.default_matmul_precision("highest"):
        ours = np.asarray(forward_inputs(params, cfg, inputs))[:, : ids.shape[1]]
    valid = mask.astype(bool)
    assert np.max(np.abs(ours - ref)[valid]) <= 1e-4


def test_same_bucket_does_not_recompile(checkpoints):
    model_dir, _ = checkpoints["gqa2_untied"]
    params, cfg = load_params(model_dir)
    rng = np.random.default_rng(2)
    outs, traces = [], []
    for grid in ([1, 4, 6], [1, 8, 2]):  # 24 and 16 patches, same patch bucket; different text lengths
        n = (grid[1] // 2) * (grid[2] // 2)
        ids = [11, 12, VISION_START] + [IMAGE] * n + [VISION_END] + list(rng.integers(10, 1000, 7))
        pv = rng.standard_normal((grid[1] * grid[2], PATCH_DIM)).astype(np.float32)
        inputs = prepare_inputs(cfg, [ids], None, pv, [grid], text_buckets=(32,), patch_buckets=(32,))
        with count_traces() as traced:
            outs.append(np.asarray(forward_inputs(params, cfg, inputs)))
        traces.append(traced["forward_inputs"])
    assert traces[1] == 0 and traces[0] <= 1
    assert outs[0].shape == outs[1].shape


def test_rope_index_known_answer():
    cfg = Qwen2VLConfig.from_hf_dict({"vision_config": {}, "image_token_id": IMAGE})
    t = 20
    ids = np.array([[t, t, t, VISION_START] + [IMAGE] * 6 + [VISION_END, t, t]])
    pos, delta = get_rope_index(ids, np.ones_like(ids), np.array([[1, 4, 6]]), cfg)
    np.testing.assert_array_equal(pos[0, 0], [0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 7, 8, 9])
    np.testing.assert_array_equal(pos[1, 0], [0, 1, 2, 3, 4, 4, 4, 5, 5, 5, 7, 8, 9])
    np.testing.assert_array_equal(pos[2, 0], [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9])
    assert delta.tolist() == [-3]
    # Left padding: masked slots get position 0 and the delta uses the unpadded length.
    padded = np.concatenate([np.zeros((1, 2), ids.dtype), ids], axis=1)
    mask = np.concatenate([np.zeros((1, 2)), np.ones_like(ids)], axis=1)
    pos2, delta2 = get_rope_index(padded, mask, np.array([[1, 4, 6]]), cfg)
    np.testing.assert_array_equal(pos2[:, :, 2:], pos)
    assert np.all(pos2[:, :, :2] == 0) and delta2.tolist() == [-3]


def test_vision_ids_known_answer():
    pos = vision_position_ids(np.array([[1, 4, 6]]), 2)
    np.testing.assert_array_equal(pos[:6], [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3]])
    seg = vision_segment_ids(np.array([[1, 4, 6], [2, 2, 2]]))
    # cu_seqlens [0, 24, 28, 32]: one segment per temporal slice.
    np.testing.assert_array_equal(np.bincount(seg), [24, 4, 4])


def test_mrope_section_layout():
    # d = 16, sections [2, 3, 3]: T T H H H W W W on the half dimension.
    np.testing.assert_array_equal(mrope_section_rows((2, 3, 3)), [0, 0, 1, 1, 1, 2, 2, 2])


def test_config_flat_and_nested_layouts_agree():
    flat = {  # the Hub's flat layout
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": True,
        "vision_config": {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "in_chans": 3,
            "mlp_ratio": 2,
        },
        "image_token_id": 5,
        "video_token_id": 6,
        "vision_start_token_id": 3,
        "vision_end_token_id": 4,
    }
    a = Qwen2VLConfig.from_hf_dict(flat)
    b = Qwen2VLConfig.from_hf_dict(a.to_hf_dict())
    assert a == b
    assert a.text.rope_theta == 50000.0 and a.text.mrope_section == (2, 3, 3) and a.tie_word_embeddings
    assert a.text.rms_norm_eps == 1e-6 and a.vision.mlp_ratio == 2
    assert hash(a) == hash(b)
    from transformers import Qwen2VLConfig as HFConfig

    hf = HFConfig(**a.to_hf_dict())
    assert hf.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
    assert hf.text_config.rope_parameters["rope_theta"] == 50000.0
    assert hf.tie_word_embeddings and hf.vision_config.embed_dim == 32 and hf.image_token_id == 5


def test_config_rejects_bad_mrope():
    with pytest.raises(ValueError, match="mrope_section"):
        Qwen2VLConfig.from_hf_dict(
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "rope_scaling": {"mrope_section": [2, 2, 2]},
                "vision_config": {"hidden_size": 64},
            }
        )


def test_prepare_inputs_errors_name_the_problem():
    cfg = Qwen2VLConfig.from_hf_dict({"vision_config": {}, "image_token_id": IMAGE})
    ids = [1, VISION_START] + [IMAGE] * 6 + [VISION_END]
    pv = np.zeros((24, cfg.vision.patch_dim), np.float32)
    with pytest.raises(ValueError, match="6 image tokens but the images give 4"):
        prepare_inputs(cfg, [ids], None, pv[:16], [[1, 4, 4]])
    with pytest.raises(ValueError, match="covers 16 patches but pixel_values has 24"):
        prepare_inputs(cfg, [ids], None, pv, [[1, 4, 4]])
    with pytest.raises(ValueError, match="no pixel_values"):
        prepare_inputs(cfg, [ids])
    with pytest.raises(ValueError, match="largest bucket"):
        prepare_inputs(cfg, [ids], None, pv, [[1, 4, 6]], text_buckets=(4,))
