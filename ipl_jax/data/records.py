"""The common step record every reader and the synthetic world produce, and a seeded sample of steps.

All geometry is in screen fractions [0, 1] with (x, y) order; boxes are (x1, y1, x2, y2).
"""

from __future__ import annotations

import dataclasses
import io
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from ipl_jax.coat.actions import Action

ImageRef = str | Path | bytes | Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class UIElement:
    """One annotated UI element: box in screen fractions, its text, and its kind (e.g. TEXT, ICON_HOME, button)."""

    box: tuple[float, float, float, float]
    text: str = ""
    kind: str = ""
    clickable: bool = True


@dataclasses.dataclass(frozen=True)
class CoaT:
    """Chain-of-Action-Thought annotations (AITZ field names, without the ``coat_`` prefix)."""

    screen_desc: str = ""
    action_think: str = ""
    action_desc: str = ""
    action_result: str = ""


COAT_FIELDS = tuple(f.name for f in dataclasses.fields(CoaT))


def coat_or_none(fields: dict) -> CoaT | None:
    """A ``CoaT`` from ``{field: text}`` (missing / None read as ""), or None when every field is blank."""
    texts = {f: fields.get(f) or "" for f in COAT_FIELDS}
    return CoaT(**texts) if any(t.strip() for t in texts.values()) else None


@dataclasses.dataclass(frozen=True)
class Step:
    """One decision step of an episode.

    ``image``: a path, PNG/JPEG bytes, or a zero-argument callable returning a PIL image, loaded lazily
    (``load_image``). ``history``: the action texts (s3) of the episode's previous steps.
    """

    episode_id: str
    step_id: int
    instruction: str
    image: ImageRef
    screen_size: tuple[int, int]  # (width, height) in pixels
    action: Action
    history: tuple[str, ...] = ()
    elements: tuple[UIElement, ...] = ()
    coat: CoaT | None = None
    step_instruction: str | None = None  # AndroidControl's low-level instruction
    meta: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def load_image(self):

        ref = self.image
        if callable(ref):
            img = ref()
        elif isinstance(ref, (bytes, bytearray)):
            img = Image.open(io.BytesIO(ref))
        else:
            img = Image.open(ref)
        img.load()
        return img.convert("RGB")

    def image_size(self) -> tuple[int, int] | None:
        """The screenshot's (width, height) without decoding it (file header, or a callable's ``size``); else None."""

        ref = self.image
        if callable(ref):
            size = getattr(ref, "size", None)
            return None if size is None else (int(size[0]), int(size[1]))
        with Image.open(io.BytesIO(ref) if isinstance(ref, (bytes, bytearray)) else ref) as img:
            return img.size


@dataclasses.dataclass(frozen=True)
class Episode:
    episode_id: str
    instruction: str
    steps: tuple[Step, ...]
    meta: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)


class DataError(ValueError):
    """A malformed data record. The message names the file, the record and the field."""

    def __init__(self, file, record, field, problem):
        self.file, self.record, self.field, self.problem = str(file), record, field, problem
        super().__init__(f"{file}: record {record}: field {field!r}: {problem}")


def sample_steps(steps: Sequence[Step], n: int, seed: int) -> list[Step]:
    """A seeded sample of ``n`` steps (all when n <= 0 or n >= len), kept in their original order."""
    steps = list(steps)
    if n <= 0 or n >= len(steps):
        return steps
    keep = sorted(random.Random(seed).sample(range(len(steps)), n))
    return [steps[i] for i in keep]
