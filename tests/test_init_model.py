"""`ipl-jax init-model`: random checkpoints of the published Qwen2-VL and Qwen3-VL architectures.

A shrunk variant of the 2B layout (--override) is written and read back by our loader and by transformers (same
tensors, same logits); the 2B / 7B (Qwen3-VL: 2B / 8B) tensor lists equal transformers' model built on the meta
device; the tokenizer's special tokens sit at the published ids without changing how text encodes; weights stream
to disk one shard at a time; bad invocations end in one line.
"""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.trees import assert_trees_equal  # noqa: E402

from ipl_jax.cli import main as cli_main  # noqa: E402
from ipl_jax.data.tokenizer import SPECIAL_TOKENS, load_tokenizer  # noqa: E402
from ipl_jax.model import Qwen2VLConfig, load_params  # noqa: E402
from ipl_jax.model.weights import canonical_name  # noqa: E402
from ipl_jax.pipeline.init_model import checkpoint_config, tensor_shapes, write_random_checkpoint  # noqa: E402
from ipl_jax.planning.shapes import ARCHITECTURES  # noqa: E402

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_scaling": {"mrope_section": [2, 3, 3]},
    "vision_config": {"depth": 2, "embed_dim": 32, "num_heads": 4},
}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("init") / "small"
    rc = cli_main(["init-model", "--architecture", "qwen2-vl-2b", "--out", str(out), "--override", json.dumps(SMALL)])
    assert rc == 0
    return out


def test_small_checkpoint_loads_in_ours_and_in_transformers(small):
    from ipl_jax.model.parity import compare

    cfg_json = json.loads((small / "config.json").read_text())
    assert cfg_json["torch_dtype"] == "bfloat16" and cfg_json["vocab_size"] == 151936  # the published vocabulary
    assert "text_config" not in cfg_json and cfg_json["rope_scaling"]["type"] == "mrope"  # the Hub's flat layout
    cfg = Qwen2VLConfig.from_hf_dict(cfg_json)
    assert (cfg.text.hidden_size, cfg.text.num_hidden_layers, cfg.vision.embed_dim) == (64, 2, 32)
    assert cfg.vision.hidden_size == 64 and cfg.tie_word_embeddings
    params, _ = load_params(str(small))
    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(str(small))
    assert model.dtype == torch.bfloat16
    ours = {
        "model.embed_tokens.weight": np.asarray(params["model"]["embed_tokens"]["embedding"], np.float32),
        "model.layers.1.mlp.up_proj.weight": np.asarray(params["model"]["layers"]["mlp"]["up_proj"]["kernel"][1]).T,
        "visual.blocks.0.attn.qkv.weight": np.asarray(params["visual"]["blocks"]["attn"]["qkv"]["kernel"][0]).T,
    }
    theirs = {canonical_name(k): v.float().numpy() for k, v in model.state_dict().items()}
    assert_trees_equal({k: v.astype(np.float32) for k, v in ours.items()}, {k: theirs[k] for k in ours})
    emb = ours["model.embed_tokens.weight"]
    assert abs(float(emb.std()) - 0.02) < 1e-3 and abs(float(emb.mean())) < 1e-3  # normal(0, initializer_range)
    norms = np.asarray(params["model"]["layers"]["input_layernorm"]["scale"], np.float32)
    biases = np.asarray(params["model"]["layers"]["self_attn"]["q_proj"]["bias"], np.float32)
    assert np.all(norms == 1.0) and np.all(biases == 0.0)
    # our forward and transformers' agree on the written weights
    assert compare(str(small))["max_abs_logit_diff"] < 1e-4


def test_tokenizer_specials_at_the_published_ids(small):
    cfg = json.loads((small / "config.json").read_text())
    published = ARCHITECTURES["qwen2-vl-2b"]
    for key in ("bos_token_id", "eos_token_id", "image_token_id", "video_token_id", "vision_start_token_id"):
        assert cfg[key] == published[key]
    tok = load_tokenizer(small)
    vocab = tok.hf.get_vocab()
    assert [vocab[s] for s in SPECIAL_TOKENS] == list(range(151643, 151643 + len(SPECIAL_TOKENS)))
    assert tok.ids.image_pad == cfg["image_token_id"] and tok.ids.eos[0] == cfg["eos_token_id"]
    assert len(tok) <= cfg["vocab_size"]
    text = "Open Settings and turn on Wi-Fi. The screen shows a search bar."
    ids = tok.encode(text)
    assert tok.decode(ids) == text and max(ids) < 151643 and len(ids) < len(text) / 2  # learnt pieces, not bytes
    gen = json.loads((small / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [cfg["eos_token_id"], cfg["bos_token_id"]]


def test_filled_vocabulary_leaves_encodings_unchanged():
    from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer

    corpus = default_corpus(n_lines=200)
    plain = train_tokenizer(corpus, 600)
    filled = train_tokenizer(corpus, 600, specials_at=5000)
    n = plain.token_to_id("<|endoftext|>")  # the learnt pieces, then the specials
    assert filled.get_vocab_size() == 5000 + len(SPECIAL_TOKENS) and filled.token_to_id("<|endoftext|>") == 5000
    for line in corpus[:50] + ["<|im_start|>user\nclick(Search)<|im_end|>"]:
        assert filled.encode(line).ids == [i if i < n else i - n + 5000 for i in plain.encode(line).ids]
    fillers = [filled.id_to_token(i) for i in range(n, 5000)]
    assert all(len(f) == 3 for f in fillers) and len(set(fillers)) == 5000 - n
    assert not set(fillers) & set(plain.get_vocab())


@pytest.mark.parametrize("arch", ["qwen2-vl-2b", "qwen2-vl-7b", "qwen3-vl-2b", "qwen3-vl-8b"])
def test_published_shapes_equal_transformers(arch, capsys):
    hf = checkpoint_config(arch)
    prefix = "Qwen3VL" if arch.startswith("qwen3") else "Qwen2VL"
    config = getattr(transformers, f"{prefix}Config").from_dict(hf)
    with torch.device("meta"):
        model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config)
    on_disk = canonical_name if prefix == "Qwen2VL" else str  # Qwen3-VL stores the in-memory names
    theirs = {on_disk(k): tuple(v.shape) for k, v in model.state_dict().items()}
    if hf["tie_word_embeddings"]:
        embed = on_disk("model.language_model.embed_tokens.weight")
        assert theirs.pop("lm_head.weight") == theirs[embed]  # tied: not on disk
    ours = dict(tensor_shapes(hf))
    assert ours == theirs
    expected = {  # the published totals
        "qwen2-vl-2b": 2_208_985_600,
        "qwen2-vl-7b": 8_291_375_616,
        "qwen3-vl-2b": 2_127_532_032,
        "qwen3-vl-8b": 8_767_123_696,
    }[arch]
    assert sum(math.prod(s) for s in ours.values()) == expected
    # --dry-run lists the same tensors and writes nothing
    assert cli_main(["init-model", "--architecture", arch, "--out", "/nonexistent/never", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    listed = {n: tuple(json.loads(s)) for n, s in (line.split("\t") for line in lines[:-1])}
    assert listed == ours and f"{expected:,} parameters" in lines[-1]


def test_weights_stream_one_shard_at_a_time(tmp_path, monkeypatch):
    import ipl_jax.model.weights as weights

    real_save = weights.save_file
    shard_bytes = []

    def recording_save(tensors, path, metadata=None):
        shard_bytes.append(sum(a.nbytes for a in tensors.values()))
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(weights, "save_file", recording_save)  # where write_safetensors calls it
    hf = checkpoint_config("qwen2-vl-2b", SMALL)
    limit = 4 << 20
    summary = write_random_checkpoint(tmp_path / "sharded", hf, seed=0, max_shard_bytes=limit)
    largest = max(math.prod(s) for _, s in tensor_shapes(hf)) * 2
    assert len(summary["files"]) == len(shard_bytes) > 1
    assert max(shard_bytes) <= max(limit, largest)  # a shard is closed before it would pass the limit
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == summary["files"]
    # the same seed gives the same weights, sharded or not
    write_random_checkpoint(tmp_path / "single", hf, seed=0)
    a, _ = load_params(str(tmp_path / "sharded"))
    b, _ = load_params(str(tmp_path / "single"))
    assert_trees_equal(a, b)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--architecture", "qwen2-vl-3b"], "invalid choice: 'qwen2-vl-3b'"),
        (["--architecture", "qwen2-vl-2b", "--out", "{file}"], "exists and is not a directory"),
        (["--architecture", "qwen2-vl-2b", "--out", "{file}/sub"], "is a file"),
        (["--architecture", "qwen2-vl-2b", "--out", "{ckpt}"], "already holds a checkpoint"),
        (
            ["--architecture", "qwen2-vl-2b", "--out", "{tmp}/o", "--override", '{"hidden_size": 96}'],
            "must sum to head_dim/2",
        ),
    ],
)
def test_bad_invocations_are_one_line(args, message, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    if "--out" not in args:
        args = args + ["--out", "{tmp}/o"]
    for key, path in (("{file}", tmp_path / "file"), ("{ckpt}", tmp_path / "ckpt"), ("{tmp}", tmp_path)):
        args = [a.replace(key, str(path)) for a in args]
    rc = cli_main(["init-model", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert err.startswith("ipl-jax init-model: ")
    assert not (tmp_path / "o").exists()
