"""One step record as bytes: the stable encoding of ``records.Step`` inside ArrayRecord shards.

Version 1: magic ``b"IPLSTEP"``, uint8 version, uint32 little-endian header length H, H bytes of
``canonical_json`` header, then the screenshot's PNG / JPEG bytes. Floats round-trip bit for bit; tuples in
``meta`` come back as lists.
"""

from __future__ import annotations

import io
import itertools
import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ipl_jax.coat.actions import Action
from ipl_jax.data.records import DataError, Episode, Step, UIElement, coat_or_none

MAGIC = b"IPLSTEP"
RECORD_VERSION = 1
_PREFIX = struct.Struct("<7sBI")  # magic, version, header length
IMAGE_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg"}
_COAT_FIELDS = ("screen_desc", "action_think", "action_desc", "action_result")


def canonical_json(value: Any, what: str = "value") -> str:
    """The one JSON text of ``value`` used everywhere in packed data (sorted keys, no spaces, no NaN)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON-serialisable: {e}") from None


def image_format(data: bytes) -> str | None:
    """ "png" / "jpeg" from the bytes' signature, else None."""
    return next((fmt for sig, fmt in IMAGE_SIGNATURES.items() if data.startswith(sig)), None)


def image_bytes(step: Step, compress_level: int = 6) -> bytes:
    """The step's screenshot as encoded bytes: PNG/JPEG files or bytes as they are, anything else encoded as PNG."""
    ref = step.image
    data = None
    if isinstance(ref, (bytes, bytearray)):
        data = bytes(ref)
    elif isinstance(ref, (str, Path)):
        data = Path(ref).read_bytes()
    if data is not None and image_format(data) is not None:
        return data
    buf = io.BytesIO()
    step.load_image().save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def step_header(step: Step, episode: Episode, image_fmt: str) -> dict:
    """The JSON header of one step (see the module docstring)."""
    return {
        "episode_id": str(step.episode_id),
        "step_id": int(step.step_id),
        "instruction": step.instruction,
        "screen_size": [int(v) for v in step.screen_size],
        "action": step.action.to_json(),
        "history": list(step.history),
        "elements": [
            {"box": [float(v) for v in el.box], "text": el.text, "kind": el.kind, "clickable": bool(el.clickable)}
            for el in step.elements
        ],
        "coat": None if step.coat is None else {f: getattr(step.coat, f) for f in _COAT_FIELDS},
        "step_instruction": step.step_instruction,
        "meta": dict(step.meta),
        "episode": {"instruction": episode.instruction, "meta": dict(episode.meta)},
        "image_format": image_fmt,
    }


def encode_step(step: Step, episode: Episode, image: bytes) -> bytes:
    """One record: prefix + header + ``image`` (encoded PNG/JPEG bytes, e.g. from ``image_bytes``)."""
    fmt = image_format(image)
    if fmt is None:
        raise ValueError(f"episode {step.episode_id} step {step.step_id}: screenshot is neither PNG nor JPEG")
    header = canonical_json(step_header(step, episode, fmt), f"episode {step.episode_id} step {step.step_id}")
    raw = header.encode("utf-8")
    return _PREFIX.pack(MAGIC, RECORD_VERSION, len(raw)) + raw + image


def split_record(payload: bytes, where: tuple) -> tuple[dict, memoryview]:
    """(header dict, image bytes view) of one record; raises ``DataError`` naming ``where`` and the bad part."""
    if len(payload) < _PREFIX.size:
        raise DataError(*where, "<record>", f"{len(payload)} bytes: too short for an ipl-jax step record")
    magic, version, n = _PREFIX.unpack_from(payload)
    if magic != MAGIC:
        raise DataError(*where, "<magic>", f"not an ipl-jax step record (starts with {bytes(payload[:7])!r})")
    if version != RECORD_VERSION:
        raise DataError(
            *where,
            "<version>",
            f"record version {version}; this ipl-jax reads version {RECORD_VERSION} (repack with ipl-jax pack-data)",
        )
    end = _PREFIX.size + n
    if end > len(payload):
        raise DataError(*where, "<header>", f"header of {n} bytes runs past the record's {len(payload)} bytes")
    try:
        header = json.loads(bytes(payload[_PREFIX.size : end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(*where, "<header>", f"not valid UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise DataError(*where, "<header>", f"expected a JSON object, got {type(header).__name__}")
    image = memoryview(payload)[end:]
    if image_format(bytes(image[:8])) is None:
        raise DataError(*where, "image", "screenshot bytes are neither PNG nor JPEG")
    return header, image


def image_offset(payload: bytes) -> int:
    """Where the screenshot starts in a record already known to be valid."""
    return _PREFIX.size + _PREFIX.unpack_from(payload)[2]


def _field(header: dict, key: str, kind: type, where):
    if key not in header:
        raise DataError(*where, key, "missing")
    v = header[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise DataError(*where, key, f"expected {kind.__name__}, got {type(v).__name__}")
    return v


def step_from_header(header: dict, image: Any, where: tuple) -> tuple[Step, dict]:
    """(Step, episode info {instruction, meta}) from a decoded header; ``image`` becomes ``Step.image``.
    Raises ``DataError`` naming the first bad field."""
    size = _field(header, "screen_size", list, where)
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
        raise DataError(*where, "screen_size", f"expected [width, height] > 0, got {size!r}")
    try:
        action = Action.from_json(_field(header, "action", dict, where))
    except (TypeError, ValueError) as e:
        raise DataError(*where, "action", f"not an action: {e}") from None
    try:
        elements = tuple(
            UIElement(
                box=tuple(float(v) for v in el["box"]),
                text=el["text"],
                kind=el["kind"],
                clickable=bool(el["clickable"]),
            )
            for el in _field(header, "elements", list, where)
        )
    except (TypeError, KeyError, ValueError) as e:
        raise DataError(*where, "elements", f"malformed element: {e!r}") from None
    coat = header.get("coat")
    if coat is not None:
        if not isinstance(coat, dict) or not all(isinstance(coat.get(f) or "", str) for f in _COAT_FIELDS):
            raise DataError(*where, "coat", "expected an object of four strings")
        coat = coat_or_none(coat)  # all blank: the step is action-only
    step_instruction = header.get("step_instruction")
    if step_instruction is not None and not isinstance(step_instruction, str):
        raise DataError(*where, "step_instruction", "expected a string or null")
    history = _field(header, "history", list, where)
    if not all(isinstance(h, str) for h in history):
        raise DataError(*where, "history", "expected a list of strings")
    episode = _field(header, "episode", dict, where)
    if not isinstance(episode.get("instruction"), str) or not isinstance(episode.get("meta", {}), dict):
        raise DataError(*where, "episode", "expected {instruction: str, meta: object}")
    step_id = _field(header, "step_id", int, where)
    step = Step(
        episode_id=_field(header, "episode_id", str, where),
        step_id=step_id,
        instruction=_field(header, "instruction", str, where),
        image=image,
        screen_size=(size[0], size[1]),
        action=action,
        history=tuple(history),
        elements=elements,
        coat=coat,
        step_instruction=step_instruction,
        meta=_field(header, "meta", dict, where),
    )
    return step, {"instruction": episode["instruction"], "meta": episode.get("meta", {})}


def group_episodes(steps: Iterable[tuple[Step, dict]]) -> list[Episode]:
    """Episodes from (step, episode info) pairs in packing order; an episode's steps are consecutive and its first
    step's info describes it."""
    episodes = []
    for _, run in itertools.groupby(steps, key=lambda pair: pair[0].episode_id):
        run = list(run)
        info = run[0][1]
        episodes.append(
            Episode(
                episode_id=run[0][0].episode_id,
                instruction=info["instruction"],
                steps=tuple(step for step, _ in run),
                meta=info["meta"],
            )
        )
    return episodes
