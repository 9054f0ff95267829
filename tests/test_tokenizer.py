"""Tokenizer loading (tiny and Hub-layout directories), special ids, image-token expansion."""

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer, write_tokenizer
from ipl_jax.data.tokenizer import SPECIAL_TOKENS, expand_image_tokens, image_token_repeats, load_tokenizer

QWEN_FIRST_SPECIAL_ID = 151643


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(train_tokenizer(default_corpus(n_lines=300), vocab_size=600), d)
    return d


@pytest.fixture(scope="module")
def hub_layout_dir(tiny_dir, tmp_path_factory):
    """A directory laid out like a Hub Qwen2-VL tokenizer: the regular vocabulary fills ids 0..151642, the special
    tokens sit at 151643.., the template is inline in tokenizer_config.json, eos comes from generation_config."""
    d = tmp_path_factory.mktemp("hub")
    tj = json.loads((tiny_dir / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    for i in range(len(vocab), QWEN_FIRST_SPECIAL_ID):
        vocab[f"<unused_{i}>"] = i
    for i, t in enumerate(tj["added_tokens"]):
        t["id"] = QWEN_FIRST_SPECIAL_ID + i
    (d / "tokenizer.json").write_text(json.dumps(tj))
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 32768,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in tj["added_tokens"]},
        "chat_template": (tiny_dir / "chat_template.jinja").read_text(),
    }
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    return d


def test_tiny_ids_and_single_token_specials(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    vocab = tok.hf.get_vocab()
    ids = tok.ids
    assert (ids.im_start, ids.im_end, ids.image_pad, ids.box_start) == (
        vocab["<|im_start|>"],
        vocab["<|im_end|>"],
        vocab["<|image_pad|>"],
        vocab["<|box_start|>"],
    )
    assert ids.pad == ids.endoftext and ids.eos == (ids.im_end, ids.endoftext)
    text = "click <|box_start|>(12,345),(678,9)<|box_end|><|im_end|>"
    enc = tok.encode(text)
    assert enc.count(ids.box_start) == enc.count(ids.box_end) == enc.count(ids.im_end) == 1
    assert tok.decode(enc) == text
    for s in SPECIAL_TOKENS:
        assert tok.encode(s) == [vocab[s]]
    # digits are single tokens (Qwen2's pre-tokenizer), so coordinates are spelt digit by digit
    assert len(tok.encode("(12,345)")) == 8


def test_hub_layout_directory(hub_layout_dir, tiny_dir):
    tok = load_tokenizer(hub_layout_dir)
    assert tok.ids.endoftext == 151643 and tok.ids.im_start == 151644 and tok.ids.im_end == 151645
    assert (tok.ids.vision_start, tok.ids.vision_end, tok.ids.image_pad, tok.ids.video_pad) == (
        151652,
        151653,
        151655,
        151656,
    )
    assert (tok.ids.box_start, tok.ids.box_end) == (151648, 151649)
    assert tok.ids.eos == (151645, 151643)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Open Maps."}]}]
    text = tok.render(msgs, add_generation_prompt=True)
    small = load_tokenizer(tiny_dir)
    assert text == small.render(msgs, add_generation_prompt=True)
    # same text pieces, only the special ids moved
    remap = {small.hf.get_vocab()[s]: QWEN_FIRST_SPECIAL_ID + i for i, s in enumerate(SPECIAL_TOKENS)}
    assert tok.encode(text) == [remap.get(i, i) for i in small.encode(text)]


def test_template_in_chat_template_json(tiny_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text((tiny_dir / name).read_text())
    (tmp_path / "chat_template.json").write_text(
        json.dumps({"chat_template": (tiny_dir / "chat_template.jinja").read_text()})
    )
    tok = load_tokenizer(tmp_path)
    assert tok.render([{"role": "user", "content": "hi"}]).endswith("<|im_start|>user\nhi<|im_end|>\n")


def test_missing_pieces_are_clear_errors(tiny_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "tokenizer.json").write_text((tiny_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text((tiny_dir / "tokenizer_config.json").read_text())
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(tmp_path)


def test_expand_image_tokens_known_answer():
    P = 9
    ids = [1, P, 2, 3, P, 4]
    grids = [[1, 4, 6], [1, 2, 2]]  # 24/4 = 6 tokens, 4/4 = 1 token
    out = expand_image_tokens(ids, grids, 2, image_pad_id=P)
    np.testing.assert_array_equal(out, [1, P, P, P, P, P, P, 2, 3, P, 4])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(image_token_repeats(ids, grids, 2, image_pad_id=P), [1, 6, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="2 <\\|image_pad\\|> tokens but 1 image grids"):
        expand_image_tokens(ids, grids[:1], 2, image_pad_id=P)


def test_wrapper_expand_matches_grid(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    ids = tok.encode("<|vision_start|><|image_pad|><|vision_end|>hi")
    out = tok.expand_image_tokens(ids, [[1, 6, 8]], merge_size=2)
    assert int((out == tok.ids.image_pad).sum()) == 12 and len(out) == len(ids) + 11
