"""Tiny random transformers Qwen2-VL (and Qwen3-VL) checkpoints (the parity references) and the token / patch
inputs they read."""

from __future__ import annotations

import numpy as np

from support import EOS, FIRST_TEXT_ID, IMAGE, VIDEO, VISION_END, VISION_START

# The special ids and norm epsilon of every tiny transformers checkpoint here: its text_config's and its own.
TEXT_IDS = dict(rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
VISION_IDS = dict(
    image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END
)


def tiny_hf_config(
    *,
    tie: bool = False,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 1000,
    hidden: int = 64,
    layers: int = 2,
    vision_embed: int = 32,
    vision_depth: int = 2,
    vision_heads: int = 2,
):
    """A transformers ``Qwen2VLConfig`` (nested v5 form) for a tiny random model."""
    from transformers import Qwen2VLConfig

    from ipl_jax.model.sizes import mrope_split

    mrope = list(mrope_split(hidden // heads))
    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            **TEXT_IDS,
            rope_parameters={"rope_type": "default", "mrope_section": mrope, "rope_theta": 10000.0},
        ),
        vision_config=dict(
            depth=vision_depth, embed_dim=vision_embed, hidden_size=hidden, num_heads=vision_heads, mlp_ratio=2
        ),
        **VISION_IDS,
        tie_word_embeddings=tie,
    )


def random_hf_model(model_class, config, seed: int = 0, scale: float = 8.0):
    """A random ``model_class(config)`` (eager attention, float32): weights x ``scale`` so logits are far from zero
    (std >= 0.5); biases and norm weights random (transformers starts them at 0 and 1, which would hide bias and
    norm bugs)."""
    import torch

    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))  # non-trivial norm weights
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.mul_(scale)
    for c in (model.config, model.model.visual.config, model.model.language_model.config):
        c._attn_implementation = "eager"
    return model.eval()


def tiny_hf_model(config, seed: int = 0, scale: float = 8.0):
    """A random ``Qwen2VLForConditionalGeneration`` of ``config`` (see ``random_hf_model``)."""
    from transformers import Qwen2VLForConditionalGeneration

    return random_hf_model(Qwen2VLForConditionalGeneration, config, seed, scale)


def tiny_qwen3_model(
    text, kv, head_dim, mrope, vision, taps, tie, bias, seed, scale: float = 8.0, vocab: int = 500, experts=None
):
    """A random ``Qwen3VLForConditionalGeneration`` (eager, float32) made by transformers from its config classes:
    ``text`` / ``vision`` config fields beside KV heads, head_dim, M-RoPE sections, DeepStack ``taps``, tied
    embeddings and attention ``bias``; weights x ``scale``, biases and norm weights random (transformers starts
    them at 0 and 1, which would hide bias and norm bugs). ``experts``: text config fields of the experts, which
    make it a ``Qwen3VLMoeForConditionalGeneration``."""
    import transformers

    moe = "Moe" if experts else ""
    text = {**text, **(experts or {})}
    config = getattr(transformers, f"Qwen3VL{moe}Config")(
        text_config=dict(
            vocab_size=vocab,
            num_key_value_heads=kv,
            head_dim=head_dim,
            attention_bias=bias,
            **TEXT_IDS,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": mrope,
                "rope_theta": 1e4,
                "mrope_interleaved": True,
            },
            **text,
        ),
        vision_config=dict(out_hidden_size=text["hidden_size"], deepstack_visual_indexes=list(taps), **vision),
        **VISION_IDS,
        tie_word_embeddings=tie,
    )
    return random_hf_model(getattr(transformers, f"Qwen3VL{moe}ForConditionalGeneration"), config, seed, scale)


def random_image(rng: np.random.Generator, grid_hw: tuple[int, int], patch_dim: int):
    """pixel_values f32[h*w, patch_dim] and its grid row [1, h, w]."""
    h, w = grid_hw
    return rng.standard_normal((h * w, patch_dim)).astype(np.float32), [1, h, w]


def sample_tokens(
    rng: np.random.Generator, n_text_before: int, grids: list, n_text_after: int, vocab: int, merge: int = 2
) -> list[int]:
    """[text..., (<vs> <img>*n <ve> text...)*, text...] with random text ids."""

    def text(n):
        return list(rng.integers(FIRST_TEXT_ID, vocab, size=n))

    ids = text(n_text_before)
    for g in grids:
        n = g[0] * (g[1] // merge) * (g[2] // merge)
        ids += [VISION_START] + [IMAGE] * n + [VISION_END] + text(3)
    return ids + text(n_text_after)


def left_pad(rows: list[list[int]], pad: int = 0):
    """int64[B, T] and mask int64[B, T], left-padded (what transformers' generate expects)."""
    t = max(len(r) for r in rows)
    ids = np.full((len(rows), t), pad, np.int64)
    mask = np.zeros((len(rows), t), np.int64)
    for i, r in enumerate(rows):
        ids[i, t - len(r) :] = r
        mask[i, t - len(r) :] = 1
    return ids, mask


def hf_forward(model, ids, mask, pixel_values=None, grids=None):
    """transformers logits as numpy f32[B, T, V]."""
    import torch

    kw = dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    if pixel_values is not None:
        kw["pixel_values"] = torch.as_tensor(pixel_values)
        kw["image_grid_thw"] = torch.as_tensor(np.asarray(grids, np.int64))
        kw["mm_token_type_ids"] = torch.as_tensor((np.asarray(ids) == IMAGE).astype(np.int64))
    with torch.no_grad():
        return model(**kw).logits.float().numpy()


def hf_greedy(model, ids, mask, pixel_values, grids, max_new_tokens: int):
    """transformers' greedy ``generate`` without end tokens: the new tokens int64[B, max_new_tokens] (numpy)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.as_tensor(ids),
            attention_mask=torch.as_tensor(mask),
            pixel_values=torch.as_tensor(pixel_values),
            image_grid_thw=torch.as_tensor(np.asarray(grids)),
            mm_token_type_ids=torch.as_tensor((np.asarray(ids) == IMAGE).astype(np.int64)),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, np.asarray(ids).shape[1] :].numpy()


def save_tiny(out_dir, seed: int = 0, **config_kw):
    """Builds a tiny random model, saves it with ``save_pretrained`` to ``out_dir``; returns (dir, model)."""
    model = tiny_hf_model(tiny_hf_config(**config_kw), seed=seed)
    model.save_pretrained(str(out_dir))
    return str(out_dir), model


def two_image_batch(rng: np.random.Generator, patch_dim: int, vocab: int):
    """The standard parity batch: row 0 has two images of different sizes (grid 4x6 -> merged 2x3, and the
    non-square 6x4 -> merged 3x2, odd along one side), row 1 is shorter with one 2x4 image; left-padded.
    Returns ids, mask, pixel_values, grids."""
    grids = [[1, 4, 6], [1, 6, 4], [1, 2, 4]]
    pv = np.concatenate([random_image(rng, tuple(g[1:]), patch_dim)[0] for g in grids])
    r0 = sample_tokens(rng, 5, grids[:2], 4, vocab)
    r1 = sample_tokens(rng, 2, grids[2:], 3, vocab)
    ids, mask = left_pad([r0, r1])
    return ids, mask, pv, grids


def assert_rope_index_matches(hf_model, cfg, ids: np.ndarray, mask: np.ndarray, grids) -> None:
    """Our M-RoPE positions and deltas for a batch equal transformers' ``get_rope_index`` on its valid tokens."""
    import torch

    from ipl_jax.model.inputs import get_rope_index

    ref_pos, ref_delta = hf_model.model.get_rope_index(
        torch.as_tensor(ids),
        image_grid_thw=torch.as_tensor(np.asarray(grids)),
        attention_mask=torch.as_tensor(mask),
        mm_token_type_ids=torch.as_tensor((ids == IMAGE).astype(np.int64)),
    )
    pos, delta = get_rope_index(ids, mask, np.asarray(grids), cfg)
    valid = mask.astype(bool)
    np.testing.assert_array_equal(pos[:, valid], ref_pos.numpy()[:, valid])
    np.testing.assert_array_equal(delta, ref_delta.numpy()[:, 0])


def saved_models(tmp_path_factory, make, configs: dict) -> dict:
    """name -> (directory, model): ``make(**kw)`` for each config, saved in transformers' format."""
    out = {}
    for name, kw in configs.items():
        model = make(**kw)
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(str(d))
        out[name] = (str(d), model)
    return out


def assert_logits_close(label: str, ours: np.ndarray, ref: np.ndarray, mask: np.ndarray, tol: float) -> None:
    """Our logits within ``tol`` of transformers' on the valid tokens, which must be far from zero (std >= 0.5)."""
    valid = mask.astype(bool)
    diff = float(np.max(np.abs(ours - ref)[valid]))
    print(f"{label}: max |logit diff| {diff:.3g}, logit std {ref[valid].std():.3g}")
    assert ref[valid].std() >= 0.5
    assert diff <= tol


def assert_reloads_equal(export_dir, hf_model, architecture: str) -> None:
    """transformers loads ``export_dir`` as ``architecture`` with every tensor equal to ``hf_model``'s."""
    import torch
    import transformers

    loaded = transformers.AutoModelForImageTextToText.from_pretrained(
        str(export_dir), attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(loaded).__name__ == architecture
    theirs, want = loaded.state_dict(), hf_model.state_dict()
    assert set(theirs) == set(want)
    for name, tensor in want.items():
        assert torch.equal(theirs[name], tensor), name
