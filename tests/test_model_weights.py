"""Hugging Face weight I/O: export that transformers loads, the sharded-index form, both key namings."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from support.hf_models import hf_forward, save_tiny, two_image_batch
from support.trees import assert_trees_equal

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import prepare_inputs
from ipl_jax.model.params import init_params, iter_paths, param_shapes
from ipl_jax.model.text import forward_inputs
from ipl_jax.model.weights import load_params, save_params

PATCH_DIM = 3 * 2 * 14 * 14


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("untied"), seed=5, tie=False)


@pytest.fixture(scope="module")
def batch():
    return two_image_batch(np.random.default_rng(7), PATCH_DIM, 1000)


def _hf_load(model_dir):
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    model, info = Qwen2VLForConditionalGeneration.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def test_export_roundtrip_through_transformers(untied, batch, tmp_path):
    model_dir, hf_model = untied
    params, cfg = load_params(model_dir)
    save_params(params, cfg, str(tmp_path))
    assert sorted(load_file(str(tmp_path / "model.safetensors"))) == sorted(
        load_file(os.path.join(model_dir, "model.safetensors"))
    )
    ids, mask, pv, grids = batch
    reloaded = _hf_load(str(tmp_path))
    a = hf_forward(hf_model, ids, mask, pv, grids)
    b = hf_forward(reloaded, ids, mask, pv, grids)
    assert np.max(np.abs(a - b)[mask.astype(bool)]) <= 1e-5


@pytest.mark.e2e
def test_export_of_our_own_params_is_what_transformers_computes(untied, batch, tmp_path):
    """Weights that never came from transformers (our init, tied embeddings) exported and run by it."""
    _, hf_model = untied
    cfg = Qwen2VLConfig.from_hf_dict(hf_model.config.to_dict()).replace(tie_word_embeddings=True)
    params = init_params(cfg, jax.random.key(0), std=0.15)
    save_params(params, cfg, str(tmp_path))
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    ids, mask, pv, grids = batch
    ref = hf_forward(_hf_load(str(tmp_path)), ids, mask, pv, grids)
    inputs = prepare_inputs(cfg, ids, mask, pv, grids, text_buckets=(64,), patch_buckets=(96,))
    with jax.default_matmul_precision("highest"):
        ours = np.asarray(forward_inputs(params, cfg, inputs))[:, : ids.shape[1]]
    valid = mask.astype(bool)
    assert 0.5 <= ref[valid].std() <= 5.0, ref[valid].std()
    assert np.max(np.abs(ours - ref)[valid]) <= 1e-4


def test_loader_reads_sharded_index_and_in_memory_names(untied, tmp_path):
    model_dir, _ = untied
    original, cfg = load_params(model_dir)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))

    def in_memory(name):
        if name.startswith("visual."):
            return "model." + name
        if name.startswith("model."):
            return "model.language_model." + name[len("model.") :]
        return name

    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fn, part in halves.items():
        save_file({in_memory(n): tensors[n] for n in part}, str(tmp_path / fn), metadata={"format": "pt"})
        weight_map.update({in_memory(n): fn for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(open(os.path.join(model_dir, "config.json")).read())
    loaded, cfg2 = load_params(str(tmp_path))
    assert cfg2 == cfg
    assert_trees_equal(loaded, original)


def test_save_in_shards_and_bfloat16_roundtrip(untied, tmp_path):
    model_dir, _ = untied
    params, cfg = load_params(model_dir, dtype=jnp.bfloat16)
    assert cfg.param_dtype == "bfloat16"
    assert all(leaf.dtype == jnp.bfloat16 for _, leaf in iter_paths(params))
    save_params(params, cfg, str(tmp_path), max_shard_bytes=100_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    stored = load_file(str(tmp_path / index["weight_map"]["model.norm.weight"]))["model.norm.weight"]
    assert stored.dtype == jnp.bfloat16
    again, cfg2 = load_params(str(tmp_path), dtype=jnp.bfloat16)
    assert cfg2.param_dtype == "bfloat16"
    assert_trees_equal(again, params)
    as_f32, cfg3 = load_params(str(tmp_path))  # the default storage dtype is float32, whatever the file holds
    assert cfg3.param_dtype == "float32"
    assert_trees_equal(as_f32, jax.tree.map(lambda x: x.astype(jnp.float32), params))


def test_init_params_has_the_loaded_layout(untied):
    model_dir, _ = untied
    loaded, cfg = load_params(model_dir)
    shapes = param_shapes(cfg)
    init = init_params(cfg, jax.random.key(1))
    for tree in (shapes, init):
        assert jax.tree.structure(tree) == jax.tree.structure(loaded)
        assert [x.shape for x in jax.tree.leaves(tree)] == [x.shape for x in jax.tree.leaves(loaded)]


def test_loader_errors_name_file_and_tensor(untied, tmp_path):
    model_dir, _ = untied
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    (tmp_path / "config.json").write_text(open(os.path.join(model_dir, "config.json")).read())
    broken = dict(tensors)
    del broken["model.layers.1.mlp.up_proj.weight"]
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        load_params(str(tmp_path))
    broken = dict(tensors)
    broken["model.norm.weight"] = np.zeros(3, np.float32)
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.norm.weight.*shape \(3,\)"):
        load_params(str(tmp_path))
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_params(str(tmp_path))


def test_export_command_from_orbax_params(untied, tmp_path):
    """``ipl-jax export``: an Orbax params tree + the base model's config -> a HF directory."""
    import orbax.checkpoint as ocp

    from ipl_jax.cli import main as cli_main

    model_dir, _ = untied
    params, cfg = load_params(model_dir)
    changed = jax.tree.map(lambda x: x * 0.5, params)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(str(tmp_path / "orbax"), changed)
    out = tmp_path / "exported"
    assert cli_main(["export", "--model", model_dir, "--orbax-params", str(tmp_path / "orbax"), "--out", str(out)]) == 0
    again, cfg2 = load_params(str(out))
    assert cfg2 == cfg
    assert_trees_equal(again, changed)


def test_export_command_from_training_checkpoint(untied, tmp_path):
    """``ipl-jax export --orbax-checkpoint``: a TrainState checkpoint (vision frozen) -> a HF directory that keeps the
    base model's side files and holds exactly the trained weights."""
    import optax

    from ipl_jax.cli import main as cli_main
    from ipl_jax.training.checkpoint import Checkpointer
    from ipl_jax.training.state import create_train_state

    model_dir, _ = untied
    with open(os.path.join(model_dir, "preprocessor_config.json"), "w") as f:
        json.dump({"min_pixels": 3136, "max_pixels": 50176}, f)
    params, cfg = load_params(model_dir)
    changed = jax.tree.map(lambda x: x * 0.5, params)
    state = create_train_state(changed, optax.adamw(1e-3), jax.random.PRNGKey(0), freeze_regex=r"^visual/")
    ckpt = Checkpointer(str(tmp_path / "ckpt"), save_every=1, keep=2, async_save=False)
    ckpt.save(3, state, force=True)
    ckpt.wait()
    ckpt.close()
    out = tmp_path / "exported"
    assert (
        cli_main(["export", "--model", model_dir, "--orbax-checkpoint", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    )
    again, cfg2 = load_params(str(out))
    assert cfg2 == cfg
    assert_trees_equal(again, changed)
    assert (out / "preprocessor_config.json").is_file()
    assert (
        cli_main(
            [
                "export",
                "--model",
                model_dir,
                "--orbax-checkpoint",
                str(tmp_path / "missing"),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
