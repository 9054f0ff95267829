"""Tiny random Qwen2-VL checkpoints: they load in transformers, tokenizer ids match the config, CLI works."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import load_file  # noqa: E402
from support.trees import assert_trees_equal  # noqa: E402

from ipl_jax.cli.make_tiny import main as make_tiny_main  # noqa: E402
from ipl_jax.data import tiny  # noqa: E402
from ipl_jax.data.image_processing import ImageProcessorConfig, preprocess_images  # noqa: E402
from ipl_jax.data.tokenizer import SPECIAL_TOKENS, load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny.make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0)


def _image(h=100, w=80, seed=0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _forward(model, tok, cfg, img, text="Describe the screen."):
    pv, grid = preprocess_images([img], config=cfg)
    s = tok.render(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], add_generation_prompt=True
    )
    ids = torch.tensor(tok.expand_image_tokens(tok.encode(s), grid, cfg.merge_size)[None].astype(np.int64))
    with torch.no_grad():
        return model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=torch.tensor(pv),
            image_grid_thw=torch.tensor(grid),
            mm_token_type_ids=(ids == model.config.image_token_id).long(),
        ).logits[0]


def test_loads_in_transformers_and_ids_match(ckpt):
    names = {p.name for p in ckpt.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
        "generation_config.json",
    } <= names
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_vl" and "text_config" in cfg and "vision_config" in cfg  # v5 nested form
    assert cfg["vision_config"]["hidden_size"] == cfg["text_config"]["hidden_size"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    # every special token is one id, the same id through our wrapper, and the config agrees
    tok = load_tokenizer(ckpt)
    for s in SPECIAL_TOKENS:
        assert len(hf_tok.encode(s, add_special_tokens=False)) == 1, s
    vocab = hf_tok.get_vocab()
    assert [vocab[s] for s in SPECIAL_TOKENS] == list(range(vocab["<|endoftext|>"], vocab["<|endoftext|>"] + 14))
    assert cfg["image_token_id"] == vocab["<|image_pad|>"] == tok.ids.image_pad
    assert cfg["video_token_id"] == vocab["<|video_pad|>"] == tok.ids.video_pad
    assert cfg["vision_start_token_id"] == vocab["<|vision_start|>"] == tok.ids.vision_start
    assert cfg["vision_end_token_id"] == vocab["<|vision_end|>"] == tok.ids.vision_end
    assert cfg["text_config"]["eos_token_id"] == tok.ids.im_end
    assert cfg["text_config"]["vocab_size"] >= len(hf_tok)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.ids.im_end, tok.ids.endoftext] and tok.ids.eos == tuple(gen["eos_token_id"])

    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(str(ckpt)).eval()
    icfg = ImageProcessorConfig.load(ckpt)
    logits = _forward(model, tok, icfg, _image())
    assert logits.shape[-1] == cfg["text_config"]["vocab_size"] and torch.isfinite(logits).all()
    # the image reaches the text model: other pixels give other logits at the last position
    other = _forward(model, tok, icfg, _image(seed=1))
    assert not torch.allclose(logits[-1], other[-1])


def test_chat_template_structure(ckpt):
    tok = load_tokenizer(ckpt)
    msgs = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]},
        {"role": "assistant", "content": "A list."},
    ]
    assert tok.render(msgs) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is shown?<|im_end|>\n"
        "<|im_start|>assistant\nA list.<|im_end|>\n"
    )
    assert tok.render(msgs[:1], add_generation_prompt=True).endswith("<|im_end|>\n<|im_start|>assistant\n")
    with_sys = [{"role": "system", "content": "Be brief."}] + msgs
    assert tok.render(with_sys).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert tok.render(msgs, add_vision_id=True).count("Picture 1: <|vision_start|>") == 1
    ids = tok.encode(tok.render(msgs))
    assert ids[0] == tok.ids.im_start and ids.count(tok.ids.image_pad) == 1 and ids.count(tok.ids.im_end) == 3
    assert tok.decode(ids) == tok.render(msgs)  # byte-level BPE round trip


def test_same_seed_same_weights_and_random_biases(ckpt, tmp_path):
    again = tiny.make_tiny_checkpoint(tmp_path / "again", seed=0)
    a, b = load_file(str(ckpt / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert_trees_equal(a, b)
    assert (ckpt / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
    # biases and norms are not left at transformers' zeros / ones
    assert np.abs(a["model.layers.0.self_attn.q_proj.bias"]).max() > 0
    assert np.abs(a["model.norm.weight"] - 1).max() > 0
    assert "lm_head.weight" in a  # untied by default


def test_scale_and_cli_flags(ckpt, tmp_path):
    out = tmp_path / "scaled"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["zebracrossing app opened", "tap the zebracrossing icon"] * 30))
    rc = make_tiny_main(
        [
            "--out",
            str(out),
            "--seed",
            "0",
            "--scale",
            "4",
            "--hidden-size",
            "32",
            "--heads",
            "2",
            "--corpus",
            str(corpus),
            "--kv-heads",
            "1",
            "--layers",
            "1",
            "--vision-depth",
            "1",
            "--tie-embeddings",
            "--vocab-size",
            "700",
            "--min-pixels",
            "1000",
            "--max-pixels",
            "20000",
            "--model-config",
            json.dumps({"vision_config": {"embed_dim": 16, "num_heads": 2}}),
        ]
    )
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())
    t, v = cfg["text_config"], cfg["vision_config"]
    assert (t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["num_hidden_layers"]) == (
        32,
        2,
        1,
        1,
    )
    assert t["rope_parameters"]["mrope_section"] == [2, 3, 3]  # derived: sums to head_dim/2 = 8
    assert (v["depth"], v["embed_dim"], v["num_heads"], v["hidden_size"]) == (1, 16, 2, 32)
    assert cfg["tie_word_embeddings"] is True and t["vocab_size"] == 700
    # the tokenizer learnt the given corpus, and the chat scaffolding is always in it
    tok = load_tokenizer(out)
    assert len(tok.encode(" zebracrossing")) == 1
    assert [len(tok.encode(r)) for r in ("system", "user", "assistant")] == [1, 1, 1]
    pc = ImageProcessorConfig.load(out)
    assert (pc.min_pixels, pc.max_pixels) == (1000, 20000)
    w = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in w  # tied
    # scale multiplies the initialisation (std 0.02) of every Linear weight
    assert 0.06 < w["model.layers.0.mlp.up_proj.weight"].std() < 0.1
    base = load_file(str(ckpt / "model.safetensors"))
    assert 0.015 < base["model.layers.0.mlp.up_proj.weight"].std() < 0.025
    # the scaled model's logits are far from zero
    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(str(out)).eval()
    logits = _forward(model, tok, pc, _image())
    assert logits.std() > 1.0


def test_config_errors():
    ids = {s: 500 + i for i, s in enumerate(SPECIAL_TOKENS)}
    with pytest.raises(ValueError, match="image_token_id"):
        tiny.build_config_dict({"image_token_id": 3}, 600, ids)
    with pytest.raises(ValueError, match="mrope_section"):
        tiny.build_config_dict({"rope_parameters": {"mrope_section": [1, 1, 1]}}, 600, ids)
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        tiny.build_config_dict({"vocab_size": 100}, 600, ids)
    flat = tiny.build_config_dict(
        {"hidden_size": 128, "num_attention_heads": 4, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}},
        600,
        ids,
    )
    assert flat["text_config"]["hidden_size"] == 128 and flat["vision_config"]["hidden_size"] == 128
    assert flat["text_config"]["rope_parameters"]["mrope_section"] == [4, 6, 6]
    assert flat["text_config"]["rope_parameters"]["rope_type"] == "default"
    assert flat["image_token_id"] == ids["<|image_pad|>"]
