"""Small Qwen2-VL configs from a few dimensions: the random models of the tests, the benchmarks and the smoke runs.

``small_config(Size(...))`` fills in what follows from the dimensions: the M-RoPE sections (``mrope_split``), the
merger's width (the text width) and the special ids at the top of the vocabulary (``top_ids``); every other field
keeps ``TextConfig`` / ``VisionConfig``'s default unless given.
"""

from __future__ import annotations

from typing import NamedTuple

from ipl_jax.model.config import Qwen2VLConfig, TextConfig, VisionConfig, mrope_split


class Size(NamedTuple):
    """The dimensions of a small model: text width, layers, query / key-value heads, MLP width, vocabulary; the
    ViT's width, depth and heads, its MLP ratio and patch side."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    vocab: int
    v_dim: int
    v_depth: int
    v_heads: int
    mlp_ratio: int = 4
    patch_size: int = 14


class SpecialIds(NamedTuple):
    """The image, video, vision start / end ids and the end-of-turn id."""

    image: int
    video: int
    vision_start: int
    vision_end: int
    eos: int

    def config_fields(self) -> dict[str, int]:
        """The ``Qwen2VLConfig`` fields these ids fill (the end-of-turn id goes in its text config)."""
        return dict(
            image_token_id=self.image,
            video_token_id=self.video,
            vision_start_token_id=self.vision_start,
            vision_end_token_id=self.vision_end,
        )


def top_ids(vocab: int) -> SpecialIds:
    """The special ids at the top of a vocabulary of ``vocab``: vision start / end, image, video, then (last) the
    end of a turn; every lower id is text."""
    return SpecialIds(image=vocab - 4, video=vocab - 3, vision_start=vocab - 6, vision_end=vocab - 5, eos=vocab - 1)


def small_config(
    size: Size,
    *,
    ids: SpecialIds | None = None,
    mrope: tuple[int, int, int] | None = None,
    tie: bool = False,
    **text,
) -> Qwen2VLConfig:
    """A Qwen2-VL config of ``size``: special ``ids`` (default ``top_ids``), M-RoPE sections ``mrope`` (default
    ``mrope_split`` of the head dimension), tied embeddings or not; ``text``: other ``TextConfig`` fields
    (``rms_norm_eps``, ``rope_theta``, ``bos_token_id``, ``pad_token_id``)."""
    ids = ids or top_ids(size.vocab)
    return Qwen2VLConfig(
        vision=VisionConfig(
            depth=size.v_depth,
            embed_dim=size.v_dim,
            hidden_size=size.hidden,
            num_heads=size.v_heads,
            mlp_ratio=size.mlp_ratio,
            patch_size=size.patch_size,
        ),
        text=TextConfig(
            vocab_size=size.vocab,
            hidden_size=size.hidden,
            intermediate_size=size.inter,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            num_key_value_heads=size.kv_heads,
            mrope_section=mrope or mrope_split(size.hidden // size.heads),
            eos_token_id=(ids.eos,),
            **text,
        ),
        tie_word_embeddings=tie,
        **ids.config_fields(),
    )
