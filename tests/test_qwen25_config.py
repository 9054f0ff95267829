"""Qwen2.5-VL configs: both HF layouts read the way transformers reads them, the published 3B architecture (tensor
names, shapes and parameter count against transformers' model), and the shipped UI-R1 job config."""

from __future__ import annotations

import copy

import pytest

from ipl_jax.configs.loader import load_settings
from ipl_jax.configs.qwen25vl_3b_uir1 import QWEN25VL_3B, uir1_published
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import count_params, param_layout, param_shapes
from ipl_jax.model.weights import canonical_name

TEXT_3584 = {"text_config": {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4}}


def test_3b_flat_hub_layout():
    cfg = Qwen2VLConfig.from_hf_dict(copy.deepcopy(QWEN25VL_3B))
    t, v = cfg.text, cfg.vision
    assert cfg.model_type == "qwen2_5_vl" and cfg.tie_word_embeddings
    assert (
        t.vocab_size,
        t.hidden_size,
        t.intermediate_size,
        t.num_hidden_layers,
        t.num_attention_heads,
        t.num_key_value_heads,
        t.head_dim,
    ) == (151936, 2048, 11008, 36, 16, 2, 128)
    assert (t.rope_theta, t.mrope_section, t.rms_norm_eps) == (1e6, (16, 24, 24), 1e-6)
    assert (v.depth, v.embed_dim, v.hidden_size, v.mlp_dim, v.num_heads, v.head_dim) == (32, 1280, 2048, 3420, 16, 80)
    assert (v.window_size, v.window_tokens, v.fullatt_block_indexes) == (112, 4, (7, 15, 23, 31))
    assert (v.hidden_act, v.rope_theta, v.tokens_per_second) == ("silu", 10000.0, 2)


def test_3b_matches_transformers_names_shapes_and_count():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Qwen2_5_VLConfig(**copy.deepcopy(QWEN25VL_3B))
    cfg = Qwen2VLConfig.from_hf_dict(copy.deepcopy(QWEN25VL_3B))
    # transformers' reading of the same file
    assert hf_cfg.vision_config.hidden_size == cfg.vision.embed_dim
    assert hf_cfg.vision_config.out_hidden_size == cfg.vision.hidden_size
    assert hf_cfg.text_config.rope_parameters["mrope_section"] == list(cfg.text.mrope_section)
    assert hf_cfg.text_config.rope_parameters["rope_theta"] == cfg.text.rope_theta
    assert hf_cfg.tie_word_embeddings == cfg.tie_word_embeddings
    with torch.device("meta"):  # shapes only, no memory
        model = transformers.Qwen2_5_VLForConditionalGeneration(hf_cfg)
    theirs = {canonical_name(n): tuple(p.shape) for n, p in model.named_parameters()}
    ours = {}
    for ent in param_layout(cfg):
        per_layer = ent.shape[1:] if ent.stacked else ent.shape
        if ent.transform == "linear":
            per_layer = per_layer[::-1]
        for i in range(ent.shape[0] if ent.stacked else 1):
            ours[ent.hf_name.format(i=i)] = per_layer
    theirs.pop("lm_head.weight", None)  # tied: not a separate tensor here
    conv = ours.pop("visual.patch_embed.proj.weight")
    assert theirs.pop("visual.patch_embed.proj.weight") == (conv[1], 3, 2, 14, 14)
    assert ours == theirs
    n = count_params(param_shapes(cfg))
    assert n == sum(p.numel() for p in model.parameters()) == 3_754_622_976


def test_nested_layout_round_trip_through_transformers():
    transformers = pytest.importorskip("transformers")
    cfg = Qwen2VLConfig.from_hf_dict(copy.deepcopy(QWEN25VL_3B))
    nested = cfg.to_hf_dict()
    assert nested["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert nested["vision_config"]["model_type"] == "qwen2_5_vl_vision"
    assert "embed_dim" not in nested["vision_config"]
    assert Qwen2VLConfig.from_hf_dict(nested) == cfg
    # transformers 5 writes the nested layout back; it reads to the same config
    saved = transformers.Qwen2_5_VLConfig(**copy.deepcopy(nested)).to_dict()
    assert Qwen2VLConfig.from_hf_dict(saved) == cfg


def test_class_defaults_match_transformers():
    """Fields missing from a Qwen2.5-VL config take transformers' class defaults (not Qwen2-VL's). (Its text
    default, width 8192 with 64 heads, does not fit its vision default out_hidden_size 3584: both get 3584.)"""
    transformers = pytest.importorskip("transformers")
    cfg = Qwen2VLConfig.from_hf_dict({"model_type": "qwen2_5_vl", "vision_config": {}, **TEXT_3584})
    hf = transformers.Qwen2_5_VLConfig(**TEXT_3584)
    hv, ht = hf.vision_config, hf.text_config
    v, t = cfg.vision, cfg.text
    assert (v.depth, v.embed_dim, v.hidden_size, v.mlp_dim, v.num_heads, v.window_size, v.tokens_per_second) == (
        hv.depth,
        hv.hidden_size,
        hv.out_hidden_size,
        hv.intermediate_size,
        hv.num_heads,
        hv.window_size,
        hv.tokens_per_second,
    )
    assert v.fullatt_block_indexes == tuple(hv.fullatt_block_indexes) and v.hidden_act == hv.hidden_act
    assert (t.hidden_size, t.vocab_size, t.rms_norm_eps, t.rope_theta) == (
        ht.hidden_size,
        ht.vocab_size,
        ht.rms_norm_eps,
        ht.rope_parameters["rope_theta"],
    )


@pytest.mark.parametrize(
    "d, needle",
    [
        ({"model_type": "qwen3_omni_moe", "vision_config": {}}, "model_type 'qwen3_omni_moe'"),
        ({"model_type": "qwen2_5_vl", "vision_config": {"window_size": 14}, **TEXT_3584}, "window_size 14"),
        (
            {"model_type": "qwen2_5_vl", "vision_config": {"hidden_act": "quick_gelu"}, **TEXT_3584},
            "hidden_act 'quick_gelu'",
        ),
        ({"model_type": "qwen2_5_vl", "vision_config": {}}, "vision hidden_size 3584 must equal the text hidden_size"),
    ],
)
def test_bad_configs_name_the_field(d, needle):
    with pytest.raises(ValueError, match=needle):
        Qwen2VLConfig.from_hf_dict(d)


def test_qwen2_vl_configs_stay_qwen2_vl():
    cfg = Qwen2VLConfig.from_hf_dict({"vision_config": {"embed_dim": 64, "hidden_size": 8192}})
    assert cfg.model_type == "qwen2_vl" and cfg.vision.mlp_dim == 256 and cfg.vision.window_tokens == 0
    assert cfg.to_hf_dict()["architectures"] == ["Qwen2VLForConditionalGeneration"]


def test_uir1_job_config():
    c = load_settings("qwen25vl_3b_uir1")
    published = uir1_published("think")
    assert (published["learning_rate"], published["group_size"], published["epochs"]) == (9.98e-7, 8, 8)
    assert published["prompts_per_update"] == 16 and c.model.max_pixels == 12_845_056
    assert (published["clip_eps"], published["kl_beta"], published["adv_eps"]) == (0.2, 0.04, 1e-4)
    assert published["think"] and not published["dast"] and published["prompt_style"] == "uir1"
    # the job's GRPO round takes the published settings it has fields for
    g = c.rl.grpo
    assert c.ipl.method == "grpo" and g.style == "think_answer" and c.ipl.freeze_vision
    assert (g.learning_rate, g.group_size, g.prompts_per_batch, g.clip_eps, g.kl_beta, g.dast) == (
        9.98e-7,
        8,
        16,
        0.2,
        0.04,
        False,
    )
    # the largest image allowed fits the largest buckets
    assert max(c.buckets.patches) >= c.model.max_pixels // (14 * 14)
    assert max(c.buckets.tokens) >= c.model.max_pixels // (28 * 28) + published["max_prompt_length"]
    # c.model repeats the checkpoint's sizes
    arch = Qwen2VLConfig.from_hf_dict(copy.deepcopy(QWEN25VL_3B))
    t, v = c.model.text, c.model.vision
    assert (t.hidden_size, t.num_hidden_layers, v.embed_dim, t.vocab_size) == (
        arch.text.hidden_size,
        arch.text.num_hidden_layers,
        arch.vision.embed_dim,
        arch.text.vocab_size,
    )
    assert load_settings("qwen25vl_3b_uir1:dast").rl.grpo.dast
    dast, nothink = uir1_published("dast"), uir1_published("nothink")
    assert dast["dast"] and dast["think"] and dast["epochs"] == 4
    assert not nothink["dast"] and not nothink["think"] and nothink["epochs"] == 4
    with pytest.raises(Exception, match="unknown variant"):
        load_settings("qwen25vl_3b_uir1:fast")
