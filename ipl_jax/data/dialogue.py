"""CoaT steps as four-turn chats (method.md §2), tokenised two ways.

A ``Step`` becomes::

    system    (the template's default)
    user      <image> + DESCRIBE                      -> assistant s1: the screen description
    user      THINK(instruction, action history)      -> assistant s2: the thought
    user      ACT (lists the action forms)            -> assistant s3: format_action(step.action)
    user      GROUND                                  -> assistant s4: format_grounding(target box)  (click/long_press)

The prompt wording lives in ``CoaTPrompts`` (short on purpose: a tiny model is trained on CPU).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CoaTPrompts:
    """The user-turn wording of the CoaT dialogue. ``think`` is formatted with ``instruction`` and ``history``.

    The content follows the paper's appendix prompts (page description; thought from task + history; the action
    forms; a 0..1000 box for the tap), in as few tokens as we could.
    """

    system: str | None = None  # None: the chat template's default system message
    describe: str = "Describe the screen: texts, buttons, icons, inputs."
    think: str = "Task: {instruction}\nDone: {history}\nThink: what I did, what the screen shows, what to do next."
    act: str = ('Next action? One of: click <target> | long_press <target> | type "<text>" | '
                "scroll up/down/left/right | press back/home/enter | open_app \"<app>\" | wait | stop")
    ground: str = "Box of the target, as (x1,y1),(x2,y2) in 0-1000?"
    no_history: str = "nothing yet"
    history_separator: str = "; "
    max_history: int | None = None  # keep only the last N previous actions in the thought prompt (None: all)

    def history_text(self, history) -> str:
        items = [h.strip() for h in history if h and h.strip()]
        if self.max_history is not None:
            items = items[len(items) - self.max_history:] if self.max_history > 0 else []
        return self.history_separator.join(items) if items else self.no_history

    def think_text(self, instruction: str, history) -> str:
        return self.think.format(instruction=instruction.strip(), history=self.history_text(history))

    def texts(self) -> list[str]:
        """Every fixed prompt text (for building a tokenizer corpus)."""
        out = [self.describe, self.think, self.act, self.ground, self.no_history]
        return out + ([self.system] if self.system else [])


DEFAULT_PROMPTS = CoaTPrompts()
