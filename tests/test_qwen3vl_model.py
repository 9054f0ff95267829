"""Qwen3-VL (dense) against transformers' ``Qwen3VLForConditionalGeneration`` on tiny random checkpoints that
transformers builds from its own config classes: logits (float32, max |difference| <= 1e-4, weights scaled so
logits are far from zero) with images of different aspect ratios, several images and a text-only row in one
batch; one and three DeepStack taps at different blocks (unsorted, and more taps than decoder layers); tied and
untied embeddings, GQA, odd widths, a head_dim apart from hidden / heads, attention biases; the learned position
table resampled as transformers does; greedy decoding through our KV cache against ``generate``; the export
loading back in transformers; the config's one-line errors."""

from __future__ import annotations

import functools
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.hf_models import (  # noqa: E402
    assert_logits_close,
    assert_reloads_equal,
    assert_rope_index_matches,
    hf_forward,
    hf_greedy,
    left_pad,
    random_image,
    sample_tokens,
    saved_models,
    tiny_qwen3_model,
)

from ipl_jax.model.config import Qwen2VLConfig  # noqa: E402
from ipl_jax.model.decode import greedy_generate  # noqa: E402
from ipl_jax.model.inputs import prepare_inputs, prepare_vision  # noqa: E402
from ipl_jax.model.text import forward_inputs  # noqa: E402
from ipl_jax.model.weights import load_params, save_params  # noqa: E402

PATCH_DIM = 3 * 2 * 16 * 16
VOCAB = 500
TOL = 1e-4

# "one": one DeepStack tap (block 1 of 3), untied, GQA 4:2, head_dim 24 (hidden / heads = 16), a 6x6 position grid.
# "three": three taps given out of order ([3, 0, 2]: the decoder adds block 0's, 2's, 3's), tied, odd widths (72
# over 3 heads of 20, a 48-wide tower of 3 heads, MLPs of 100 and 80), one KV head, attention biases, a 7x7 grid.
# "deep": three taps but two decoder layers (transformers adds the first two only), a 3x3 grid (images larger).
CONFIGS = {
    "one": dict(
        text=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4),
        kv=2,
        head_dim=24,
        mrope=[4, 4, 4],
        vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, num_position_embeddings=36),
        taps=[1],
        tie=False,
        bias=False,
        seed=0,
    ),
    "three": dict(
        text=dict(hidden_size=72, intermediate_size=100, num_hidden_layers=4, num_attention_heads=3),
        kv=1,
        head_dim=20,
        mrope=[4, 3, 3],
        vision=dict(depth=4, hidden_size=48, intermediate_size=80, num_heads=3, num_position_embeddings=49),
        taps=[3, 0, 2],
        tie=True,
        bias=True,
        seed=1,
    ),
    "deep": dict(
        text=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
        kv=2,
        head_dim=32,
        mrope=[6, 5, 5],
        vision=dict(depth=3, hidden_size=32, intermediate_size=32, num_heads=2, num_position_embeddings=9),
        taps=[0, 1, 2],
        tie=False,
        bias=False,
        seed=2,
    ),
}
# Grids (t, h, w) in patches: wide, tall, a thin strip and a larger one; rows: two images, one image, text only.
GRIDS = [[1, 4, 6], [1, 6, 4], [1, 2, 8], [1, 10, 6]]
PATCH_BUCKET = 192


def batch(seed: int = 0, grids=GRIDS):
    rng = np.random.default_rng(seed)
    pv = np.concatenate([random_image(rng, tuple(g[1:]), PATCH_DIM)[0] for g in grids])
    rows = [sample_tokens(rng, 5, grids[:2], 4, VOCAB), sample_tokens(rng, 2, grids[2:], 3, VOCAB)]
    rows.append(sample_tokens(rng, 9, [], 0, VOCAB))  # text only
    ids, mask = left_pad(rows)
    return ids, mask, pv, grids


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return saved_models(tmp_path_factory, functools.partial(tiny_qwen3_model, vocab=VOCAB), CONFIGS)


pytestmark = pytest.mark.usefixtures("highest_precision")


def ours(model_dir, ids, mask, pv, grids):
    params, cfg = load_params(model_dir)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET,))
    return np.asarray(forward_inputs(params, cfg, inputs))[:, : ids.shape[1]], cfg


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(models, name):
    model_dir, hf_model = models[name]
    ids, mask, pv, grids = batch(CONFIGS[name]["seed"])
    ref = hf_forward(hf_model, ids, mask, pv, grids)
    got, cfg = ours(model_dir, ids, mask, pv, grids)
    kw = CONFIGS[name]
    assert cfg.model_type == "qwen3_vl" and cfg.tie_word_embeddings == kw["tie"]
    assert cfg.vision.deepstack_visual_indexes == tuple(kw["taps"]) and cfg.text.head_dim == kw["head_dim"]
    assert_logits_close(f"qwen3-vl {name}", got, ref, mask, TOL)


def test_deepstack_and_positions_matter(models):
    """The check above would pass with DeepStack or the position table left out if they changed nothing: they
    move the logits of the image rows by far more than the tolerance."""
    model_dir, hf_model = models["one"]
    ids, mask, pv, grids = batch(0)
    ref = hf_forward(hf_model, ids, mask, pv, grids)
    params, cfg = load_params(model_dir)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET,))
    flat = jax.tree.map(lambda a: a, params)
    flat["visual"]["deepstack_merger"]["mlp_2"] = jax.tree.map(
        lambda a: a * 0, params["visual"]["deepstack_merger"]["mlp_2"]
    )
    no_pos = jax.tree.map(lambda a: a, params)
    no_pos["visual"]["pos_embed"] = {"embedding": params["visual"]["pos_embed"]["embedding"] * 0}
    valid = mask.astype(bool)
    for changed in (flat, no_pos):
        got = np.asarray(forward_inputs(changed, cfg, inputs))[:, : ids.shape[1]]
        assert np.max(np.abs(got - ref)[valid]) > 100 * TOL


def test_rope_index_matches_transformers(models):
    model_dir, hf_model = models["three"]
    ids, mask, _, grids = batch(1)
    cfg = Qwen2VLConfig.from_dir(model_dir)
    assert_rope_index_matches(hf_model, cfg, ids, mask, grids)


def test_position_table_resampling_matches_transformers(models):
    """Per patch, the resampled learned positions equal transformers' (packed images, and one image per slot)."""
    from ipl_jax.model.vision3 import position_embeddings

    model_dir, hf_model = models["three"]
    params, cfg = load_params(model_dir)
    visual = hf_model.model.visual
    grids = [[1, 4, 6], [1, 12, 2], [2, 2, 2], [1, 14, 14]]
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    index, weights = get_vision_interpolation_indices_and_weights(
        torch.as_tensor(grids), visual.num_grid_per_side, "bilinear", True, 2
    )
    with torch.no_grad():
        ref = (visual.pos_embed(index) * weights[:, :, None]).sum(1).numpy()
    n = ref.shape[0]
    vis = prepare_vision(cfg, np.zeros((n, PATCH_DIM), np.float32), grids, patch_buckets=(n + 8,))
    got = np.asarray(
        position_embeddings(params["visual"]["pos_embed"]["embedding"], jax.tree.map(lambda a: a[None], vis), cfg)
    )
    np.testing.assert_allclose(got[0, :n], ref, atol=1e-5, rtol=0)


@pytest.mark.e2e
def test_greedy_matches_transformers_generate(models):
    model_dir, hf_model = models["one"]
    ids, mask, pv, grids = batch(3)
    ref = hf_greedy(hf_model, ids, mask, pv, grids, max_new_tokens=16)
    params, cfg = load_params(model_dir)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(128,), patch_buckets=(PATCH_BUCKET,))
    tokens, n = greedy_generate(params, cfg, inputs, max_new_tokens=16)
    assert len(set(ref[0].tolist())) > 3  # not a degenerate repeat of one token
    np.testing.assert_array_equal(np.asarray(tokens), ref)
    assert np.asarray(n).tolist() == [16, 16, 16]


def test_export_loads_in_transformers(models, tmp_path):
    model_dir, hf_model = models["three"]
    params, cfg = load_params(model_dir)
    save_params(params, cfg, str(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert saved["vision_config"]["deepstack_visual_indexes"] == [3, 0, 2]
    assert Qwen2VLConfig.from_dir(tmp_path) == cfg
    assert_reloads_equal(tmp_path, hf_model, "Qwen3VLForConditionalGeneration")


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(model_type="qwen3_omni_moe"), "model_type 'qwen3_omni_moe' is not supported"),
        (dict(vision_config=dict(depth=2, deepstack_visual_indexes=[0, 2])), "vision deepstack_visual_indexes"),
        (dict(vision_config=dict(depth=2, deepstack_visual_indexes=[-1])), "vision deepstack_visual_indexes"),
        (dict(vision_config=dict(hidden_act="silu")), "vision hidden_act 'silu'"),
    ],
)
def test_bad_configs_name_the_field(change, needle):
    d = {
        "model_type": "qwen3_vl",
        "text_config": {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16},
        "vision_config": {"out_hidden_size": 64, "hidden_size": 32, "num_heads": 2},
    }
    d["text_config"]["rope_parameters"] = {"mrope_section": [2, 3, 3]}
    for k, v in change.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    with pytest.raises(ValueError, match=needle) as e:
        Qwen2VLConfig.from_hf_dict(d)
    assert "\n" not in str(e.value)


def test_slots_vmapped_rows_and_query_chunks_match_packed(models):
    """The tower on one image per slot (each slot's own grid for the position table) and on packed rows under
    ``vmap`` with attention in query chunks: the features (DeepStack columns included) of the packed batch."""
    from ipl_jax.model.inputs import prepare_vision_slots
    from ipl_jax.model.vision import encode_images, encode_images_unjitted

    params, cfg = load_params(models["three"][0])
    rng = np.random.default_rng(4)
    grids = [[1, 4, 6], [1, 10, 2], [1, 8, 8]]
    pv = np.concatenate([random_image(rng, tuple(g[1:]), PATCH_DIM)[0] for g in grids])
    n_merged = sum(g[1] * g[2] for g in grids) // 4
    packed = np.asarray(encode_images(params, cfg, prepare_vision(cfg, pv, grids, patch_buckets=(128,))))[:n_merged]
    assert packed.shape[1] == 4 * 72 and np.abs(packed).std() > 0.5
    slots = np.asarray(encode_images(params, cfg, prepare_vision_slots(cfg, pv, grids, slot_patches=72)))
    np.testing.assert_allclose(slots[:n_merged], packed, atol=1e-4, rtol=0)
    rows = [prepare_vision(cfg, pv[:24], grids[:1], (96,)), prepare_vision(cfg, pv[24:44], grids[1:2], (96,))]
    stacked = jax.tree.map(lambda *a: np.stack(a), *rows)
    chunked = cfg.replace(attention_query_chunk=16)
    both = np.asarray(jax.jit(jax.vmap(lambda v: encode_images_unjitted(params, chunked, v)))(stacked))
    np.testing.assert_allclose(both[0][:6], packed[:6], atol=1e-4, rtol=0)
    np.testing.assert_allclose(both[1][:5], packed[6:11], atol=1e-4, rtol=0)


# Qwen3-VL-2B-Instruct's config.json as published (rope and tie inside text_config, the vision model_type of the
# first release).
QWEN3VL_2B = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "tie_word_embeddings": True,
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [5, 11, 17],
        "depth": 24,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1024,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "model_type": "qwen3_vl",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
}


def test_published_2b_layout_matches_transformers():
    """The published 2B config reads as transformers reads it; tensor names, shapes and the parameter count equal
    transformers' model (built on the meta device); the nested layout written back reads to the same config."""
    import copy

    from ipl_jax.model.params import count_params, param_layout, param_shapes
    from ipl_jax.model.weights import hf_shape, stored_name

    cfg = Qwen2VLConfig.from_hf_dict(copy.deepcopy(QWEN3VL_2B))
    t, v = cfg.text, cfg.vision
    assert (t.head_dim, t.rope_theta, t.mrope_section, t.mrope_interleaved, cfg.tie_word_embeddings) == (
        128,
        5e6,
        (24, 20, 20),
        True,
        True,
    )
    assert (v.embed_dim, v.hidden_size, v.mlp_dim, v.position_grid_side, v.deepstack_taps) == (
        1024,
        2048,
        4096,
        48,
        ((5, 0), (11, 1), (17, 2)),
    )
    hf_cfg = transformers.Qwen3VLConfig(**copy.deepcopy(QWEN3VL_2B))
    with torch.device("meta"):
        model = transformers.Qwen3VLForConditionalGeneration(hf_cfg)
    theirs = {n: tuple(p.shape) for n, p in model.named_parameters()}
    ours = {}
    for ent in param_layout(cfg):
        for i in range(ent.shape[0] if ent.stacked else 1):
            ours[stored_name(ent.hf_name.format(i=i), cfg)] = hf_shape(ent, cfg)
    theirs.pop("lm_head.weight", None)  # tied
    assert ours == theirs
    assert count_params(param_shapes(cfg)) == sum(p.numel() for p in model.parameters())
    assert Qwen2VLConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    assert Qwen2VLConfig.from_hf_dict(transformers.Qwen3VLConfig(**cfg.to_hf_dict()).to_dict()) == cfg


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen3_vl_moe"])
def test_make_tiny_then_check_parity(tmp_path, capsys, arch):
    from ipl_jax.cli import main as cli_main

    out = tmp_path / "tiny3"
    assert cli_main(["make-tiny", "--arch", arch, "--scale", "8", "--out", str(out)]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == arch and saved["vision_config"]["patch_size"] == 16
    assert saved["vision_config"]["deepstack_visual_indexes"] == [0]
    assert saved["text_config"]["rope_parameters"]["mrope_interleaved"] is True
    experts = saved["text_config"].get("num_local_experts", 0)  # transformers' name of num_experts
    assert experts == (4 if arch == "qwen3_vl_moe" else 0)
    assert json.loads((out / "preprocessor_config.json").read_text())["image_mean"] == [0.5, 0.5, 0.5]
    capsys.readouterr()
    rc = cli_main(["check-parity", "--model", str(out)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(f"check-parity on make-tiny --arch {arch}: {res}")
    assert rc == 0 and res["ok"] is True
    assert res["logit_std"] >= 0.5 and res["max_abs_logit_diff"] <= TOL
