"""Rotary position embeddings: the text decoder's 3-section M-RoPE (sections in blocks, Qwen2-VL, or interleaved,
Qwen3-VL) and the vision tower's axial 2D RoPE.
Frequencies and angles are float32; text cos/sin are cast to the activation dtype, vision rotates in f32.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ipl_jax.model.config import TextConfig, VisionConfig


def rotate_half(x: jnp.ndarray) -> jnp.ndarray:
    """[x1, x2] -> [-x2, x1] on the last axis (halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """x * cos + rotate_half(x) * sin; cos/sin broadcast against x (add the head axis before calling)."""
    return x * cos + rotate_half(x) * sin


def _inv_freq(theta: float, dim: int) -> np.ndarray:
    """1 / theta^(arange(0, dim, 2) / dim) in float32, dim/2 entries."""
    return (1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))).astype(np.float32)


def mrope_section_rows(mrope_section: tuple[int, ...]) -> np.ndarray:
    """For each of the head_dim/2 frequencies, the position row (0=T, 1=H, 2=W) it reads (chunk i reads row i % 3)."""
    return np.concatenate([np.full(s, i % 3, dtype=np.int32) for i, s in enumerate(mrope_section)])


def interleaved_section_rows(mrope_section: tuple[int, ...]) -> np.ndarray:
    """Qwen3-VL's interleaved layout: frequency j reads H when j % 3 == 1 and j < 3 * sections[1], W when
    j % 3 == 2 and j < 3 * sections[2], else T (transformers' ``recomposition_frequencies``)."""
    j = np.arange(sum(mrope_section))
    rows = np.zeros(j.shape, np.int32)
    for row in (1, 2):
        rows[(j % 3 == row) & (j < 3 * mrope_section[row])] = row
    return rows


def text_cos_sin(positions: jnp.ndarray, cfg: TextConfig, dtype) -> tuple[jnp.ndarray, jnp.ndarray]:
    """M-RoPE tables: positions int32[3, B, T] (rows T, H, W) -> cos, sin dtype[B, T, head_dim] (``cat(f, f)``)."""
    d = cfg.head_dim
    inv = jnp.asarray(_inv_freq(cfg.rope_theta, d))  # f32[d/2]
    split = interleaved_section_rows if cfg.mrope_interleaved else mrope_section_rows
    rows = split(cfg.mrope_section)  # [d/2] static
    pos = positions.astype(jnp.float32)[rows]  # [d/2, B, T]
    freqs = jnp.moveaxis(pos, 0, -1) * inv  # [B, T, d/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def vision_cos_sin(pos_hw: jnp.ndarray, cfg: VisionConfig) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Axial 2D tables for the ViT: pos_hw int32[..., P, 2] -> cos, sin f32[..., P, head_dim] as
    ``[f_h, f_w, f_h, f_w]`` (``head_dim/4`` frequencies each).
    """
    hd = cfg.head_dim
    inv = jnp.asarray(_inv_freq(cfg.rope_theta, hd // 2))  # f32[hd/4]
    freqs = pos_hw.astype(jnp.float32)[..., None] * inv  # [..., P, 2, hd/4]
    fhw = jnp.concatenate([freqs[..., 0, :], freqs[..., 1, :]], axis=-1)  # [..., P, hd/2]
    emb = jnp.concatenate([fhw, fhw], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)
