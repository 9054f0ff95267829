"""CoaT steps as four-turn chats (docs/method.md §2), tokenised as training examples and as sampler segments.

Turns: DESCRIBE (with the image) -> s1, THINK -> s2, ACT -> s3 ``format_action``, GROUND -> s4
``format_grounding`` (click / long_press). ``coat_segments`` with the replies is exactly ``coat_example``.
Supervised paths raise ``MissingCoaTError`` for a step without CoaT unless the caller opts into fallbacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from ipl_jax.coat.actions import format_action, format_grounding, needs_grounding
from ipl_jax.data.batching import TrainingExample
from ipl_jax.data.image_processing import ImageProcessorConfig, preprocess_images
from ipl_jax.data.records import Step
from ipl_jax.data.screenshots import ScreenPixels, decode_pixels
from ipl_jax.data.screenshots import step_error as _step_error
from ipl_jax.data.screenshots import step_name as _step_name
from ipl_jax.data.tokenizer import IM_END, QwenTokenizer, image_token_repeats

TURNS = (1, 2, 3, 4)
TURN_NAMES = {1: "description", 2: "thought", 3: "action", 4: "grounding"}


@dataclasses.dataclass(frozen=True)
class CoaTPrompts:
    """The user-turn wording of the CoaT dialogue (the paper's appendix prompts, shortened); ``think`` is formatted
    with ``instruction`` and ``history``.
    """

    system: str | None = None  # None: the chat template's default system message
    describe: str = "Describe the screen: texts, buttons, icons, inputs."
    think: str = "Task: {instruction}\nDone: {history}\nThink: what I did, what the screen shows, what to do next."
    act: str = (
        'Next action? One of: click <target> | long_press <target> | type "<text>" | '
        "scroll up/down/left/right | press back/home/enter | open_app \"<app>\" | wait | stop"
    )
    ground: str = "Box of the target, as (x1,y1),(x2,y2) in 0-1000?"
    no_history: str = "nothing yet"
    history_separator: str = "; "
    max_history: int | None = None  # keep only the last N previous actions in the thought prompt (None: all)

    def history_text(self, history) -> str:
        items = [h.strip() for h in history if h and h.strip()]
        if self.max_history is not None:
            items = items[len(items) - self.max_history :] if self.max_history > 0 else []
        return self.history_separator.join(items) if items else self.no_history

    def think_text(self, instruction: str, history) -> str:
        return self.think.format(instruction=instruction.strip(), history=self.history_text(history))

    def texts(self) -> list[str]:
        """Every fixed prompt text (for building a tokenizer corpus)."""
        out = [self.describe, self.think, self.act, self.ground, self.no_history]
        return out + ([self.system] if self.system else [])


DEFAULT_PROMPTS = CoaTPrompts()

# How many UI element texts a description built from a step's elements may list (steps without CoaT text).
FALLBACK_MAX_ELEMENTS = 30
FALLBACK_DESCRIPTION = "A phone screen."


class MissingCoaTError(ValueError):
    """A step without a CoaT annotation (screen description and thought) handed to a path that trains on it."""


# ---------------------------------------------------------------------------------------------- step -> chat


def has_coat(step: Step) -> bool:
    """Whether a step carries its own CoaT annotation: a non-empty screen description and thought."""
    coat = step.coat
    return coat is not None and bool(coat.screen_desc.strip()) and bool(coat.action_think.strip())


def annotated_steps(steps: Sequence[Step], fallback: bool = False) -> tuple[list[Step], int]:
    """(steps a supervised path may train on, how many were left out): all with ``fallback``, else ``has_coat`` ones."""
    kept = list(steps) if fallback else [s for s in steps if has_coat(s)]
    return kept, len(steps) - len(kept)


def coat_turn_texts(step: Step, fallback: bool = False) -> dict[int, str]:
    """The golden assistant texts {1: s1, 2: s2, 3: s3, 4: s4 (click / long_press)}. Without CoaT: ``MissingCoaTError``,
    or with ``fallback`` made-up s1 (element texts) and s2 (instruction or action description).
    """
    if not fallback and not has_coat(step):
        raise MissingCoaTError(
            f"{_step_name(step)}: no CoaT annotation (screen description and thought); a supervised path needs "
            f"it (left out by the SFT stages; data.coat_fallback=true makes up the missing texts instead)"
        )
    coat = step.coat
    desc = coat.screen_desc.strip() if coat else ""
    if not desc:
        texts = [e.text.strip() for e in step.elements if e.text and e.text.strip()]
        desc = ("Screen with: " + ", ".join(texts[:FALLBACK_MAX_ELEMENTS]) + ".") if texts else FALLBACK_DESCRIPTION
    thought = coat.action_think.strip() if coat else ""
    if not thought:
        thought = (
            (step.step_instruction or "").strip()
            or (coat.action_desc.strip() if coat else "")
            or f"The next action is {format_action(step.action)}."
        )
    return {1: desc, 2: thought, **golden_action_texts(step)}


def golden_action_texts(step: Step) -> dict[int, str]:
    """The golden action turn {3: s3} and, for click / long_press, its grounding {4: s4}."""
    out = {3: format_action(step.action)}
    if needs_grounding(step.action):
        box = step.action.box
        if box is None and step.action.point is not None:
            x, y = step.action.point
            box = (x, y, x, y)  # a point-only click grounds to a degenerate box whose centre is the point
        if box is None:
            raise _step_error(step, "action.box", f"{step.action.type} action has neither a box nor a point")
        out[4] = format_grounding(box)
    return out


def coat_user_prompts(step: Step, prompts: CoaTPrompts = DEFAULT_PROMPTS) -> dict[int, str]:
    """The user-turn texts {1..4} of a step (the image is added to the first included turn)."""
    return {
        1: prompts.describe,
        2: prompts.think_text(step.instruction, step.history),
        3: prompts.act,
        4: prompts.ground,
    }


def _check_turns(turns: Sequence[int]) -> tuple[int, ...]:
    turns = tuple(int(t) for t in turns)
    if not turns or any(t not in TURNS for t in turns) or list(turns) != sorted(set(turns)):
        raise ValueError(f"turns must be an increasing subset of {TURNS}, got {turns}")
    return turns


def coat_messages(
    step: Step,
    prompts: CoaTPrompts = DEFAULT_PROMPTS,
    turns: Sequence[int] = TURNS,
    assistant_texts: Mapping[int, str] | None = None,
    fallback: bool = False,
) -> tuple[list[dict], tuple[int, ...]]:
    """Chat messages of a step and the turn number of each assistant message.

    ``turns``: CoaT turns kept (turn 4 is dropped anyway for actions without grounding); ``assistant_texts``:
    replies by turn (default: ``coat_turn_texts`` with ``fallback``).
    """
    turns = _check_turns(turns)
    texts = coat_turn_texts(step, fallback) if assistant_texts is None else dict(assistant_texts)
    users = coat_user_prompts(step, prompts)
    turns = tuple(t for t in turns if t in texts)
    messages: list[dict] = []
    if prompts.system is not None:
        messages.append({"role": "system", "content": prompts.system})
    for i, t in enumerate(turns):
        content = ([{"type": "image"}] if i == 0 else []) + [{"type": "text", "text": users[t]}]
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": texts[t]})
    return messages, turns


# ---------------------------------------------------------------------------------------------- chat text


def split_rendered_chat(tok: QwenTokenizer, messages: list[dict]) -> list[str]:
    """Cut the rendered chat at its assistant replies: [context0, reply1 + ``<|im_end|>``, context1, ...].
    Raises ValueError if a reply is not rendered verbatim and followed by ``<|im_end|>``.
    """
    full = tok.render(messages)
    pieces, pos = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        if not isinstance(m["content"], str):
            raise ValueError("assistant message content must be a string")
        head = tok.render(messages[:i], add_generation_prompt=True)
        start, end = len(head), len(head) + len(m["content"])
        if not full.startswith(head) or full[start:end] != m["content"] or not full.startswith(IM_END, end):
            raise ValueError(
                f"{tok.source}: the chat template does not render assistant message {i} as "
                f"'<header>TEXT<|im_end|>'; cannot locate the assistant turns"
            )
        pieces.append(full[pos:start])
        pos = end + len(IM_END)
        pieces.append(full[start:pos])
    if not pieces:
        raise ValueError("the chat has no assistant message")
    return pieces


# ---------------------------------------------------------------------------------------------- examples


def chat_example(
    tok: QwenTokenizer,
    messages: list[dict],
    reply_turns: Sequence[int],
    pixel_values: np.ndarray,
    image_grid_thw: np.ndarray,
    merge_size: int = 2,
    loss_turns: Sequence[int] | None = None,
    name: str = "",
) -> TrainingExample:
    """Tokenise a chat whose k-th assistant message is CoaT turn ``reply_turns[k]``; ValueError if per-piece
    tokenisation disagrees with the whole text's. ``loss_turns``: turns with loss (default all).
    """
    pieces = split_rendered_chat(tok, messages)
    if len(reply_turns) != len(pieces) // 2:
        raise ValueError(f"{len(pieces) // 2} assistant messages but {len(reply_turns)} turn numbers")
    loss_turns = set(reply_turns if loss_turns is None else loss_turns)
    ids = tok.encode("".join(pieces))
    piece_ids = [tok.encode(p) for p in pieces]
    if sum(piece_ids, []) != ids:
        raise ValueError(
            f"{name or 'chat'}: tokenising the turns separately differs from the whole text; "
            f"the tokenizer merges tokens across a turn boundary"
        )
    loss, turn = [], []
    for k, p in enumerate(piece_ids):
        t = reply_turns[k // 2] if k % 2 else 0
        loss += [int(t in loss_turns and k % 2 == 1)] * len(p)
        turn += [t] * len(p)
    rep = image_token_repeats(ids, image_grid_thw, merge_size, image_pad_id=tok.ids.image_pad)
    return TrainingExample(
        input_ids=np.repeat(np.asarray(ids, np.int32), rep),
        loss_mask=np.repeat(np.asarray(loss, np.int32), rep),
        turn_index=np.repeat(np.asarray(turn, np.int32), rep),
        pixel_values=np.asarray(pixel_values, np.float32),
        image_grid_thw=np.asarray(image_grid_thw, np.int64).reshape(-1, 3),
        name=name,
    )


def coat_example(
    step: Step,
    tok: QwenTokenizer,
    image_config: ImageProcessorConfig,
    prompts: CoaTPrompts = DEFAULT_PROMPTS,
    turns: Sequence[int] = TURNS,
    loss_turns: Sequence[int] | None = None,
    image=None,
    pixels=None,
    fallback: bool = False,
) -> TrainingExample:
    """The SFT example of a step: its CoaT dialogue with the golden replies, ``<|image_pad|>`` expanded.

    ``loss_mask`` is 1 exactly on the replies and their ``<|im_end|>``; ``turn_index`` gives their turn (0
    elsewhere). Raises ``MissingCoaTError`` for a step without CoaT unless ``fallback``.
    """
    messages, kept = coat_messages(step, prompts, turns, fallback=fallback)
    pv, grid = decode_pixels(step, image_config, image, pixels)
    return chat_example(tok, messages, kept, pv, grid, image_config.merge_size, loss_turns, name=_step_name(step))


def qa_example(
    tok: QwenTokenizer,
    image_config: ImageProcessorConfig,
    image,
    question: str,
    answer: str,
    system: str | None = None,
    name: str = "",
    pixels=None,
) -> TrainingExample:
    """A single-turn image Q&A example: user [image + question] -> assistant answer (turn 1)."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
        {"role": "assistant", "content": answer},
    ]
    if pixels is not None:
        pv, grid = np.asarray(pixels[0], np.float32), np.asarray(pixels[1], np.int64).reshape(-1, 3)
    else:
        pv, grid = preprocess_images([image], config=image_config)
    return chat_example(tok, messages, (1,), pv, grid, image_config.merge_size, name=name)


# ---------------------------------------------------------------------------------------------- sampler view


@dataclasses.dataclass(frozen=True)
class DialogueSegments:
    """The fixed pieces of a step's CoaT dialogue: prefix_ids int32[P] (before s1); turn_prompt_ids[t] int32[Q_t]
    (after turn t-1's ``<|im_end|>``); target_ids[t] (golden reply + ``<|im_end|>``, when known); turns.
    """

    prefix_ids: np.ndarray
    turn_prompt_ids: dict[int, np.ndarray]
    target_ids: dict[int, np.ndarray]
    turns: tuple[int, ...]
    pixel_values: np.ndarray | ScreenPixels
    image_grid_thw: np.ndarray
    name: str = ""


def coat_segments(
    step: Step,
    tok: QwenTokenizer,
    image_config: ImageProcessorConfig,
    prompts: CoaTPrompts = DEFAULT_PROMPTS,
    turns: Sequence[int] = TURNS,
    image=None,
    pixels=None,
) -> DialogueSegments:
    """Prefix and per-turn prompt ids of a step (all four turns by default; prompts do not depend on the replies).
    A ``ScreenPixels`` ``pixels`` is read for its grid only and becomes the segments' ``pixel_values``."""
    turns = _check_turns(turns)
    placeholder = {t: "x" for t in TURNS}  # the prompts between replies do not depend on the replies
    messages, kept = coat_messages(step, prompts, turns, assistant_texts=placeholder)
    pieces = split_rendered_chat(tok, messages)
    if isinstance(pixels, ScreenPixels):
        pv, grid = pixels, pixels.grid
    else:
        pv, grid = decode_pixels(step, image_config, image, pixels)
    prefix = tok.expand_image_tokens(tok.encode(pieces[0]), grid, image_config.merge_size)
    prompt_ids = {t: np.asarray(tok.encode(pieces[2 * k]), np.int32) for k, t in enumerate(kept) if k > 0}
    for t, p in prompt_ids.items():
        if np.any(p == tok.ids.image_pad):
            raise ValueError(f"turn {t} prompt holds an image token; only the first turn may carry the image")
    golden = coat_turn_texts(step) if has_coat(step) else golden_action_texts(step)
    targets = {t: np.asarray(tok.encode(golden[t] + IM_END), np.int32) for t in kept if t in golden}
    return DialogueSegments(
        prefix_ids=prefix,
        turn_prompt_ids=prompt_ids,
        target_ids=targets,
        turns=kept,
        pixel_values=pv,
        image_grid_thw=grid,
        name=_step_name(step),
    )
