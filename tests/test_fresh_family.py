"""The family of a fresh model (``model.family``) and a processor that disagrees with its model's patches."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from ipl_jax.configs.loader import load_settings
from ipl_jax.sections import SettingsError


def test_one_setting_chooses_a_fresh_models_family():
    """Each family's own values fill the fields left at their defaults; what a config sets stays; the processor
    cuts the family's patches with its normalisation; a wrong name or a field of another family is one line."""
    q2 = load_settings("synthetic:quick").model
    q3 = load_settings("synthetic:quick", ["--config.model.family=qwen3_vl"]).model
    cfg = q3.fresh_config()
    t, v = cfg.text, cfg.vision
    assert cfg.model_type == "qwen3_vl" and (t.qk_norm, t.qkv_bias, t.o_bias, t.mrope_interleaved) == (1, 0, 0, 1)
    assert (v.patch_size, v.hidden_act, v.position_grid_side, v.deepstack_visual_indexes) == (
        16,
        "gelu_pytorch_tanh",
        8,
        (0,),
    )
    assert (t.hidden_size, t.num_hidden_layers, v.depth, v.embed_dim) == (128, 2, 2, 64)  # the job's shape kept
    image = q3.image_processor()
    assert (image.patch_size, image.image_mean, image.max_pixels) == (16, (0.5,) * 3, q3.max_pixels)
    assert q2.fresh_config().model_type == "qwen2_vl" and q2.image_processor().patch_size == 14
    moe = load_settings("synthetic:quick", ["--config.model.family=qwen3_vl_moe"]).model.fresh_config()
    assert (moe.model_type, moe.hf_model_type, moe.vision) == ("qwen3_vl", "qwen3_vl_moe", v)
    m = moe.text
    assert (m.qk_norm, m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (1, 4, 2, 96)
    assert dataclasses.replace(m, num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0) == t
    q25 = load_settings("synthetic:quick", ["--config.model.family=qwen2_5_vl"]).model.fresh_config()
    assert (q25.model_type, q25.vision.window_tokens, q25.vision.fullatt_block_indexes) == ("qwen2_5_vl", 4, (1,))
    set_here = ["--config.model.family=qwen3_vl", "--config.model.vision.patch_size=8", "--config.model.vision.depth=4"]
    own = load_settings("synthetic:quick", set_here).model.fresh_config().vision
    assert (own.patch_size, own.deepstack_visual_indexes) == (8, (0, 1, 2))
    for flags, message in (
        (["--config.model.family=qwen4"], r"^config\.model\.family='qwen4': must be one of qwen2_vl, qwen2_5_vl, "),
        (["--config.model.text.qk_norm=true"], r"^config\.model\.text / .*: qk_norm: Qwen3-VL settings"),
    ):
        with pytest.raises(SettingsError, match=message) as e:
            load_settings("synthetic:quick", flags)
        assert "\n" not in str(e.value)


def test_a_processor_of_other_patches_is_refused_before_any_weight(tmp_path, capsys):
    """A checkpoint whose preprocessor_config.json cuts 14-pixel patches for a 16-pixel tower: one line naming
    the file and the field, from the path check and from the loaders, none of which reads a weight (the one
    tensor stored here is no weight of the model)."""
    from safetensors.numpy import save_file

    from ipl_jax import cli
    from ipl_jax.data.image_processing import ImageProcessorConfig
    from ipl_jax.eval.policy import load_policy

    cfg = load_settings("synthetic:quick", ["--config.model.family=qwen3_vl"]).model.fresh_config()
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    save_file({"not_a_weight": np.zeros(2, np.float32)}, str(d / "model.safetensors"))
    ImageProcessorConfig(patch_size=14).save(d)
    field = r"preprocessor_config\.json: field 'patch_size' is 14, the model's \(config\.json vision_config\.patch_"
    assert cli.main(["export", "--model", str(d), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("ipl-jax export: --model ") and re.search(field, err)
    with pytest.raises(ValueError, match=field):
        load_policy(str(d))
    ImageProcessorConfig.for_model(cfg).save(d)  # the model's own: the loaders go on to the weights
    with pytest.raises(KeyError, match="tensor .* not found in the checkpoint"):
        load_policy(str(d))
