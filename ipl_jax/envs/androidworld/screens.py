"""AndroidWorld screenshots: ``GET /screenshot`` answers ``{"pixels": H x W x 3 uint8 as nested JSON lists}``.

A phone screen is millions of integers (1080 x 2400 x 3 = 7.8M); building Python lists of them and converting
(``json.loads`` + ``np.asarray``) costs seconds per step, so ``decode_pixels`` reads the body's bytes with numpy:
the nesting checked against the regular H x W x 3 pattern, brackets dropped, the rest read by numpy's text parser
(``np.fromstring(..., sep=",")``). Anything the fast path does not
recognise (signs, decimals, values over 255, a ragged array) goes to the slow, general path, which
gives the same array or a one-line error. Benchmark: docs/formats.md (AndroidWorld).
"""

from __future__ import annotations

import json

import numpy as np

_KEY = b'"pixels"'
_SPACE = b" \t\r\n"


def decode_pixels(body: bytes) -> np.ndarray:
    """The (H, W, 3) uint8 array of a ``/screenshot`` response body. ValueError (one line) if it holds none."""
    fast = _decode_fast(body)
    if fast is not None:
        return fast
    return _decode_json(body)


def _decode_json(body: bytes) -> np.ndarray:
    try:
        pixels = json.loads(body)["pixels"]
        arr = np.asarray(pixels)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"screenshot: not a {{'pixels': H x W x 3}} JSON body ({type(e).__name__}: {e})") from None
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.size == 0 or arr.dtype.kind not in "iu":
        raise ValueError(f"screenshot: pixels are not an H x W x 3 integer array (shape {arr.shape}, {arr.dtype})")
    if arr.min() < 0 or arr.max() > 255:
        raise ValueError("screenshot: pixel values outside 0..255")
    return np.ascontiguousarray(arr[:, :, :3], dtype=np.uint8)


def _decode_fast(body: bytes) -> np.ndarray | None:
    """The array, or None where the body is not the plain form the fast path reads (the JSON path decides)."""
    key = body.find(_KEY)
    start = body.find(b"[", key)
    end = body.rfind(b"]")
    if key < 0 or start < 0 or end <= start or body.find(_KEY, key + 1) >= 0:
        return None
    seg = body[start : end + 1]
    if any(c in seg for c in (b" ", b"\t", b"\r", b"\n")):
        seg = seg.translate(None, _SPACE)
    first_row = seg[: seg.find(b"]]") + 2]
    w = first_row.count(b"],[") + 1
    c = first_row[: first_row.find(b"]") + 1].count(b",") + 1
    if not seg.startswith(b"[[[") or seg.startswith(b"[[[[") or c not in (3, 4):
        return None
    try:  # numpy's text parser raises on an empty number or a stray character
        values = np.fromstring(seg.translate(None, b"[]"), dtype=np.int64, sep=",")
    except ValueError:
        return None
    h = values.size // (w * c)
    if h * w * c != values.size or not _regular(seg, h, w, c) or values.min() < 0 or values.max() > 255:
        return None
    return np.ascontiguousarray(values.astype(np.uint8).reshape(h, w, c)[:, :, :3])


def _regular(seg: bytes, h: int, w: int, c: int) -> bool:
    """Whether the brackets and commas of ``seg`` are exactly those of an h x w x c nested list (not ragged)."""
    cell = b"[" + b"," * (c - 1) + b"]"
    row = b"[" + b",".join([cell] * w) + b"]"
    return seg.translate(None, b"0123456789") == b"[" + b",".join([row] * h) + b"]"
