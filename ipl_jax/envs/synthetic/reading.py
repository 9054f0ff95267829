"""Screen-reading data for pretraining a base model: screens of the training split's world (its themes, layouts
and tasks, from a seed stream of its own) with dense supervision from what the renderer knows, as one chat per
screen in the dialogue format the agent later uses.

A chat asks, about one screenshot: the CoaT description (turn 1's exact prompt), every text top to bottom,
where named elements are (the grounding turn's box format), what is at given points and, optionally, two
questions that read the episode's instruction against the screen: which screen text it names and what it says
to type (the task generator knows both). Test splits, unseen
themes, unseen layouts and unseen tasks are never drawn (``pretrain_episodes``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from ipl_jax.coat.actions import format_grounding, to_relative
from ipl_jax.data.dialogue import DEFAULT_PROMPTS, chat_example
from ipl_jax.data.evolution.screen import usable_elements
from ipl_jax.data.records import Episode, Step, UIElement
from ipl_jax.data.screenshots import decode_pixels
from ipl_jax.envs.synthetic.config import WorldConfig
from ipl_jax.envs.synthetic.content import SUBMENU_OF
from ipl_jax.envs.synthetic.dataset import SPLIT_CODES, episode_id, generate_episode, split_config
from ipl_jax.envs.synthetic.tasks import Task, sample_task

# The seed stream of pretraining screens: a split code no evaluation split uses (see ``SPLIT_CODES``).
PRETRAIN_SPLIT = "pretrain"
PRETRAIN_CODE = 9

TEXTS_PROMPT = "Read the screen's texts, top to bottom."
WHERE_PROMPT = 'Where is "{name}"? Box as (x1,y1),(x2,y2) in 0-1000.'
WHAT_PROMPT = "What is at ({x},{y}) in 0-1000?"
NAMES_PROMPT = 'Task: "{instruction}". Which text on the screen does it name?'
TYPED_PROMPT = 'Task: "{instruction}". What text does it say to type?'
NONE = "None."
STATUS_BAR = 0.045  # elements whose box ends above this screen fraction (the status bar's clock) are never asked


def pretrain_episodes(n: int, seed: int = 0, world: WorldConfig | None = None, start: int = 0) -> list[Episode]:
    """Episodes ``start .. start + n - 1`` of the training split's world (its themes, variants and task families)
    from the pretraining seed stream ``SeedSequence([seed, PRETRAIN_CODE, i])``, disjoint from every evaluation
    split's stream. Each step's ``meta["task"]`` holds the episode's task (for the task questions)."""
    assert PRETRAIN_CODE not in SPLIT_CODES.values()
    cfg = split_config("train", world)
    out = []
    for i in range(int(start), int(start) + int(n)):
        ws = int(np.random.SeedSequence([int(seed), PRETRAIN_CODE, i]).generate_state(1)[0])
        task = sample_task(np.random.default_rng([ws, 2]), cfg, unseen=False)
        eid = "9" + episode_id("train", seed, i)[1:]
        ep = generate_episode(ws, task, cfg, episode_id=eid, split=PRETRAIN_SPLIT)
        steps = tuple(dataclasses.replace(s, meta={**s.meta, "task": ep.meta["task"]}) for s in ep.steps)
        out.append(dataclasses.replace(ep, steps=steps))
    return out


def pretrain_screens(n: int, seed: int = 0, world: WorldConfig | None = None, start: int = 0) -> list[Step]:
    """The steps (one screen each) of pretraining episodes ``start .. start + n - 1`` (``pretrain_episodes``)."""
    return [s for e in pretrain_episodes(n, seed, world, start) for s in e.steps]


def screen_texts(step: Step) -> list[UIElement]:
    """The step's elements with text outside the status bar (``usable_elements``), in reading order (top to
    bottom, left to right); a repeated text once."""
    seen, out = set(), []
    for el in usable_elements(step):
        text = " ".join((el.text or "").split())
        if text and text.lower() not in seen:
            seen.add(text.lower())
            out.append(el)
    return out


def _unique(elements: Sequence[UIElement]) -> list[UIElement]:
    """Elements whose text names one element of the screen (a question about it has one answer)."""
    counts: dict[str, int] = {}
    for el in elements:
        counts[el.text] = counts.get(el.text, 0) + 1
    return [el for el in elements if el.text and counts[el.text] == 1]


@dataclasses.dataclass(frozen=True)
class ReadingChat:
    """The questions of one screen's chat: ``where`` and ``what`` questions each (at most), ``max_texts`` listed;
    with ``task``, the two task questions (``task_answers``) where the step carries its task."""

    where: int = 3
    what: int = 3
    max_texts: int = 24
    task: bool = False

    @staticmethod
    def of(section) -> ReadingChat:
        """The chat a settings section asks for (``pretrain``: where, what, max_texts, task)."""
        return ReadingChat(where=section.where, what=section.what, max_texts=section.max_texts, task=section.task)


def reading_example(step: Step, seed: int, chat: ReadingChat, tokenizer, image_config):
    """The ``TrainingExample`` of one screen's reading chat: every answer trained."""
    messages = reading_messages(step, seed, chat)
    pv, grid = decode_pixels(step, image_config)
    turns = (1,) * (len(messages) // 2)
    name = f"screen {step.episode_id}/{step.step_id}"
    return chat_example(tokenizer, messages, turns, pv, grid, image_config.merge_size, name=name)


def fold_text(text: str | None) -> str:
    """Lower-case, whitespace runs collapsed to one space, stripped (how answers and screen texts compare)."""
    return " ".join((text or "").lower().split())


def task_answers(step: Step) -> tuple[str, str] | None:
    """What a reader of the instruction answers about this screen, from the step's task (``meta["task"]``):
    the screen text the task names (its contact, setting, the setting's menu, app, then the app it happens in:
    the first of these the screen shows; else "None.") and the text it says to type (query or message; else "None.").
    None without a task."""
    if "task" not in step.meta:
        return None
    task = Task.from_json(step.meta["task"])
    shown = {fold_text(e.text): e.text for e in screen_texts(step)}
    menus = [SUBMENU_OF.get(s, "") for s in (task.setting, task.setting2)]
    names = [task.contact, task.setting, task.setting2, *menus, task.app, task.target_app]
    named = next((shown[fold_text(n)] for n in names if n and fold_text(n) in shown), NONE)
    return named, (task.query or task.message or NONE)


def reading_qa(step: Step, seed: int, chat: ReadingChat = ReadingChat()) -> list[tuple[str, str, str]]:
    """The chat of one screen as [(kind, question, answer)], kind in ``describe, texts, where, what, names,
    typed``. Which elements are asked about is a pure function of ``(seed, episode, step)``."""
    rng = random.Random(f"{seed}/{step.episode_id}/{step.step_id}")
    texts = screen_texts(step)
    named = _unique([e for e in step.elements if e.box[3] > STATUS_BAR])
    qa: list[tuple[str, str, str]] = [
        ("describe", DEFAULT_PROMPTS.describe, step.coat.screen_desc),
        ("texts", TEXTS_PROMPT, "; ".join(e.text for e in texts[: chat.max_texts]) or "No text."),
    ]
    for el in rng.sample(named, min(chat.where, len(named))):
        qa.append(("where", WHERE_PROMPT.format(name=el.text), format_grounding(el.box)))
    for el in rng.sample(named, min(chat.what, len(named))):
        x, y = (el.box[0] + el.box[2]) / 2, (el.box[1] + el.box[3]) / 2
        qa.append(("what", WHAT_PROMPT.format(x=to_relative(x), y=to_relative(y)), el.text))
    answers = task_answers(step) if chat.task else None
    if answers is not None:
        qa.append(("names", NAMES_PROMPT.format(instruction=step.instruction), answers[0]))
        qa.append(("typed", TYPED_PROMPT.format(instruction=step.instruction), answers[1]))
    return qa


def reading_messages(step: Step, seed: int, chat: ReadingChat = ReadingChat()) -> list[dict]:
    """The chat of one screen (``reading_qa``) as user/assistant messages, the image in the first user message."""
    return qa_messages(reading_qa(step, seed, chat))


def qa_messages(qa: Sequence[tuple[str, str, str]]) -> list[dict]:
    """``reading_qa``'s [(kind, question, answer)] as user/assistant messages, the image in the first user message."""
    messages = []
    for k, (_, question, answer) in enumerate(qa):
        content = [{"type": "image"}, {"type": "text", "text": question}] if k == 0 else question
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]
    return messages


def reading_corpus(steps: Sequence[Step], seed: int, chat: ReadingChat = ReadingChat()) -> list[str]:
    """Every text of the reading chats (for the tokenizer)."""
    out = []
    for s in steps:
        for m in reading_messages(s, seed, chat):
            c = m["content"]
            out.append(c if isinstance(c, str) else c[1]["text"])
    return out
