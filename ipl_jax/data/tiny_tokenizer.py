"""The tiny byte-level BPE tokenizer of our test and synthetic-job checkpoints (needs ``tokenizers``): Qwen2's
pre-tokenizer, Qwen's special tokens in Qwen's order.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE

from ipl_jax.coat.actions import Action, format_action, format_grounding
from ipl_jax.data.dialogue import DEFAULT_PROMPTS
from ipl_jax.data.tokenizer import ENDOFTEXT, IM_END, QWEN2VL_CHAT_TEMPLATE, SPECIAL_TOKENS

# Qwen2's pre-tokenizer split (digits one by one, letters with one leading non-letter, newlines apart).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
    r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


class MissingDependency(ImportError):
    pass


def _require_transformers():
    try:
        import transformers
    except ImportError as e:
        raise MissingDependency("writing a tokenizer needs transformers (pip install transformers)") from e
    transformers.logging.set_verbosity_error()
    return transformers


# ---------------------------------------------------------------------------------------------- corpus

_APPS = [
    "Settings",
    "Chrome",
    "Gmail",
    "Maps",
    "YouTube",
    "Play Store",
    "Calendar",
    "Camera",
    "Photos",
    "Clock",
    "Contacts",
    "Messages",
    "Phone",
    "Files",
    "Notes",
    "Weather",
    "Music",
    "Amazon",
    "Spotify",
    "Calculator",
]
_WIDGETS = [
    "button",
    "icon",
    "search bar",
    "text field",
    "menu",
    "tab",
    "toggle",
    "checkbox",
    "link",
    "list item",
    "dialog",
    "banner",
    "slider",
    "keyboard",
    "back arrow",
    "send button",
    "home icon",
    "more options",
]
_LABELS = [
    "Search",
    "OK",
    "Cancel",
    "Save",
    "Next",
    "Done",
    "Sign in",
    "Add to cart",
    "Settings",
    "Share",
    "Delete",
    "Open",
    "Wi-Fi",
    "Bluetooth",
    "Display",
    "Battery",
    "Sound",
    "Profile",
    "Inbox",
    "Compose",
    "Send",
    "New note",
    "Alarm",
    "Timer",
    "Contacts",
    "Directions",
    "Play",
    "Pause",
    "Cart",
    "Checkout",
]
_TOPICS = [
    "weather in Paris",
    "cheap flights",
    "pizza near me",
    "news today",
    "running shoes",
    "jazz music",
    "hotel in Rome",
    "bus to airport",
    "recipe for pancakes",
    "football scores",
]
_VERBS = ["open", "find", "search for", "turn on", "turn off", "add", "delete", "share", "play", "set"]


def scaffold_texts() -> list[str]:
    """The texts of every chat (CoaT prompts, default system message, roles repeated so they become single tokens)."""
    return DEFAULT_PROMPTS.texts() * 5 + ["You are a helpful assistant."] * 5 + ["system\nuser\nassistant\n"] * 20


def default_corpus(extra: Iterable[str] = (), n_lines: int = 1500, seed: int = 0) -> list[str]:
    """GUI-ish sentences, the CoaT prompts and action / grounding texts, deterministic for a seed."""
    rnd = random.Random(seed)
    lines = scaffold_texts() + list(extra)
    for _ in range(n_lines):
        app, widget, label, topic = (rnd.choice(_APPS), rnd.choice(_WIDGETS), rnd.choice(_LABELS), rnd.choice(_TOPICS))
        box = sorted(rnd.random() for _ in range(2)) + sorted(rnd.random() for _ in range(2))
        actions = [
            Action("click", target=f"{label} {widget}"),
            Action("type", text=topic),
            Action("scroll", direction=rnd.choice(["up", "down", "left", "right"])),
            Action("press", button=rnd.choice(["back", "home", "enter"])),
            Action("stop"),
            Action("long_press", target=label),
            Action("open_app", text=app),
            Action("wait"),
        ]
        kind = rnd.randrange(6)
        if kind == 0:
            lines.append(
                f"The screen shows the {app} app with a {label} {widget}, a {rnd.choice(_WIDGETS)} "
                f"and the text \"{rnd.choice(_LABELS)}\"."
            )
        elif kind == 1:
            lines.append(f"{rnd.choice(_VERBS).capitalize()} {topic} in {app}.")
        elif kind == 2:
            lines.append(
                f"I have opened {app}. The screen shows {label}. I need to {rnd.choice(_VERBS)} "
                f"{topic}, so the next action is {format_action(rnd.choice(actions))}."
            )
        elif kind == 3:
            lines.append(format_action(rnd.choice(actions)))
        elif kind == 4:
            lines.append(format_grounding((box[0], box[2], box[1], box[3])))
        else:
            lines.append(
                DEFAULT_PROMPTS.think_text(
                    f"{rnd.choice(_VERBS)} {topic}", [format_action(rnd.choice(actions)) for _ in range(3)]
                )
            )
    return lines


# ---------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(corpus: Sequence[str], vocab_size: int, specials_at: int | None = None):
    """A byte-level BPE ``tokenizers.Tokenizer`` then the 14 Qwen specials; ``vocab_size`` bounds the size.
    ``specials_at``: the first special's id (the vocabulary is filled with unreachable pieces up to it)."""

    n_bpe = vocab_size - len(SPECIAL_TOKENS)
    if n_bpe < 256:
        raise ValueError(f"vocab_size {vocab_size} too small: need 256 bytes + {len(SPECIAL_TOKENS)} specials")
    if specials_at is not None and specials_at < min(n_bpe, 256):
        raise ValueError(f"specials_at {specials_at} leaves no room for the 256 byte tokens")
    tok = Tokenizer(
        BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe if specials_at is None else min(n_bpe, specials_at),
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # the special tokens must never be learnt as text pieces: take them out of the corpus
    cleaned = []
    for line in corpus:
        for s in SPECIAL_TOKENS:
            line = line.replace(s, " ")
        cleaned.append(line)
    tok.train_from_iterator(cleaned, trainer)
    if specials_at is not None:
        tok = _fill_vocabulary(tok, specials_at)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    return tok


def _fill_vocabulary(tok, size: int):
    """``tok`` with its BPE vocabulary filled to ``size`` entries by unreachable three-byte pieces (no merge
    makes them, so encodings are unchanged)."""

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    if len(vocab) > size:
        raise ValueError(f"the learnt vocabulary ({len(vocab)} pieces) is larger than specials_at={size}")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    fillers = ("".join(p) for p in itertools.product(alphabet, repeat=3))
    for piece in fillers:
        if len(vocab) == size:
            break
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return Tokenizer.from_str(json.dumps(spec))


def write_tokenizer(tok, out_dir: Path) -> dict[str, int]:
    """Save ``tok`` as a transformers tokenizer directory (Qwen2Tokenizer + our chat template); returns the
    special-token ids as loaded back through ``AutoTokenizer``."""
    transformers = _require_transformers()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "bos_token": None,
                "eos_token": IM_END,
                "pad_token": ENDOFTEXT,
                "unk_token": None,
                "add_prefix_space": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": 32768,
                "split_special_tokens": False,
                "errors": "replace",
            },
            indent=2,
        )
    )
    hf = transformers.AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)
    hf.chat_template = QWEN2VL_CHAT_TEMPLATE
    hf.save_pretrained(str(out_dir))
    # save_pretrained records how this call loaded the files; those keys do not belong in a checkpoint
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    vocab = hf.get_vocab()
    return {s: vocab[s] for s in SPECIAL_TOKENS}
