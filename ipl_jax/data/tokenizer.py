"""The Qwen2-VL tokenizer and chat template, loaded through transformers from a local checkpoint directory; every
id is looked up by token string. One ``<|image_pad|>`` stands for an image until ``expand_image_tokens``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Qwen2-VL's special tokens, in the order of their ids in the real vocabulary (151643 ... 151656).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
BOX_START, BOX_END = "<|box_start|>", "<|box_end|>"

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Our Jinja rendering of the Qwen2-VL chat format (all output goes through expressions, so the template's
# own layout adds no whitespace). Content is a string or a list of parts {"type": "image"} / {"type": "text"}.
QWEN2VL_CHAT_TEMPLATE = r"""{%- set counts = namespace(image=0, video=0) -%}
{%- for message in messages -%}
  {%- if loop.first and message['role'] != 'system' -%}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
  {%- endif -%}
  {{- '<|im_start|>' + message['role'] + '\n' -}}
  {%- if message['content'] is string -%}
    {{- message['content'] -}}
  {%- else -%}
    {%- for part in message['content'] -%}
      {%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}
        {%- set counts.image = counts.image + 1 -%}
        {%- if add_vision_id -%}{{- 'Picture ' + counts.image|string + ': ' -}}{%- endif -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- elif part['type'] == 'video' or 'video' in part -%}
        {%- set counts.video = counts.video + 1 -%}
        {%- if add_vision_id -%}{{- 'Video ' + counts.video|string + ': ' -}}{%- endif -%}
        {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
      {%- elif 'text' in part -%}
        {{- part['text'] -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}"""


def _import_transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:  # transformers takes seconds to import: loaded with the first tokenizer, not with every command
        import transformers
    except ImportError as e:  # pragma: no cover - transformers is a core dependency
        raise ImportError("loading a tokenizer needs the 'transformers' package (pip install transformers)") from e
    transformers.logging.set_verbosity_error()
    return transformers


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The token ids the data pipeline, sampler and model need."""

    endoftext: int
    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int
    box_start: int
    box_end: int
    pad: int
    eos: tuple[int, ...]  # ids that end a generation: <|im_end|> first, then the checkpoint's others


class QwenTokenizer:
    """A thin wrapper over a transformers tokenizer with the Qwen2-VL special ids resolved.

    ``hf`` is the underlying ``PreTrainedTokenizerBase``; ``ids`` the resolved ``SpecialIds``.
    """

    def __init__(self, hf: Any, source: str = "<tokenizer>", generation_eos: Sequence[int] = ()):
        self.hf = hf
        self.source = source
        vocab = hf.get_vocab()
        found = {}
        for tok in SPECIAL_TOKENS:
            if tok not in vocab:
                continue
            found[tok] = vocab[tok]
            pieces = hf.encode(tok, add_special_tokens=False)
            if list(pieces) != [vocab[tok]]:
                raise ValueError(
                    f"{source}: special token {tok} is not kept whole by the tokenizer (it encodes to {list(pieces)})"
                )
        required = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD, BOX_START, BOX_END)
        missing = [t for t in required if t not in found]
        if missing:
            raise ValueError(f"{source}: tokenizer lacks the Qwen2-VL special tokens {missing}")
        if getattr(hf, "chat_template", None) in (None, ""):
            raise ValueError(
                f"{source}: tokenizer has no chat template (chat_template.jinja / .json or "
                f"tokenizer_config.json 'chat_template')"
            )
        pad = hf.pad_token_id if hf.pad_token_id is not None else found[ENDOFTEXT]
        eos = [found[IM_END]]
        for e in list(generation_eos) + [found[ENDOFTEXT]]:
            if int(e) not in eos:
                eos.append(int(e))
        self.ids = SpecialIds(
            endoftext=found[ENDOFTEXT],
            im_start=found[IM_START],
            im_end=found[IM_END],
            vision_start=found[VISION_START],
            vision_end=found[VISION_END],
            image_pad=found[IMAGE_PAD],
            video_pad=found[VIDEO_PAD],
            box_start=found[BOX_START],
            box_end=found[BOX_END],
            pad=int(pad),
            eos=tuple(eos),
        )

    # ------------------------------------------------------------------------------------------- text

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings inside it become their single ids; nothing is added)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and, per token, its (start, end) character span in ``text``."""
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render(self, messages: list[dict], add_generation_prompt: bool = False, **template_kwargs) -> str:
        """The chat as text through the checkpoint's own chat template."""
        out = self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        if not isinstance(out, str):
            raise TypeError(f"{self.source}: chat template rendered {type(out).__name__}, expected str")
        return out

    # ------------------------------------------------------------------------------------------- images

    def expand_image_tokens(self, ids: Sequence[int], image_grid_thw, merge_size: int = 2) -> np.ndarray:
        """int32[T] -> int32[T'] with each ``<|image_pad|>`` repeated t*h*w/merge_size**2 times."""
        return expand_image_tokens(ids, image_grid_thw, merge_size, image_pad_id=self.ids.image_pad)


def image_token_repeats(ids: Sequence[int], image_grid_thw, merge_size: int = 2, *, image_pad_id: int) -> np.ndarray:
    """int64[T]: copies of each token (1, or t*h*w/merge_size**2 for the k-th ``<|image_pad|>``), for ``np.repeat``.

    ``image_grid_thw``: int[n, 3], one row per ``<|image_pad|>`` in order.
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    where = np.flatnonzero(ids == image_pad_id)
    if len(where) != len(grids):
        raise ValueError(f"expand_image_tokens: {len(where)} <|image_pad|> tokens but {len(grids)} image grids")
    per_image = grids.prod(axis=1)
    if np.any(per_image % (merge_size**2)):
        raise ValueError(f"expand_image_tokens: grids {grids.tolist()} not divisible by merge_size**2")
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[where] = per_image // (merge_size**2)
    return repeats


def expand_image_tokens(ids: Sequence[int], image_grid_thw, merge_size: int = 2, *, image_pad_id: int) -> np.ndarray:
    """int32[T] -> int32[T'] with each ``<|image_pad|>`` repeated t*h*w/merge_size**2 times (in order)."""
    ids = np.asarray(ids, dtype=np.int32).reshape(-1)
    return np.repeat(ids, image_token_repeats(ids, image_grid_thw, merge_size, image_pad_id=image_pad_id))


def _generation_eos(directory: Path) -> list[int]:
    p = directory / "generation_config.json"
    if not p.is_file():
        return []
    try:
        eos = json.loads(p.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{p}: not a valid generation config: {e}") from e
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def _separate_chat_template(directory: Path) -> str | None:
    """The template a checkpoint keeps beside the tokenizer config (``chat_template.jinja`` or ``.json``), or None."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    js = directory / "chat_template.json"
    if js.is_file():
        try:
            template = json.loads(js.read_text()).get("chat_template")
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{js}: not a valid chat template file: {e}") from e
        if not isinstance(template, str):
            raise ValueError(f"{js}: field 'chat_template': expected a string")
        return template
    return None


def load_tokenizer(path: str | Path) -> QwenTokenizer:
    """Load tokenizer + chat template from a local checkpoint directory (never from a hub)."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer directory {directory} does not exist")
    transformers = _import_transformers()
    try:
        hf = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory}: cannot load a tokenizer: {e}") from e
    if not getattr(hf, "chat_template", None):
        hf.chat_template = _separate_chat_template(directory)
    return QwenTokenizer(hf, source=str(directory), generation_eos=_generation_eos(directory))
