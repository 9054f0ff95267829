"""Sampled trees as text, actions, values and JSON (``tree_record``): what ``ipl-jax sample`` writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ipl_jax.coat.actions import Action, format_action, parse_action
from ipl_jax.coat.tree import NUM_TURNS, flatten_node_index
from ipl_jax.data.records import Step
from ipl_jax.data.tokenizer import IM_END

CLASS_NAMES = {0: "alpha", 1: "beta", 2: "gamma", -1: "padding"}


def decode_turn(tokenizer, ids, length: int) -> str:
    """One node's text: valid tokens decoded with special tokens kept, a closing ``<|im_end|>`` removed."""
    text = tokenizer.decode([int(i) for i in np.asarray(ids)[: int(length)]])
    if text.endswith(IM_END):
        text = text[: -len(IM_END)]
    return text.strip()


def turn_texts(tree, tokenizer) -> list[np.ndarray]:
    """Per level t = 1..4: an object array [B, b1, ..., bt] of decoded node texts."""
    out = []
    for t in range(NUM_TURNS):
        toks, lens = np.asarray(tree.tokens[t]), np.asarray(tree.lengths[t])
        flat_t, flat_l = toks.reshape(-1, toks.shape[-1]), lens.reshape(-1)
        texts = np.empty(flat_l.size, dtype=object)
        for i in range(flat_l.size):
            texts[i] = decode_turn(tokenizer, flat_t[i], flat_l[i])
        out.append(texts.reshape(lens.shape))
    return out


def leaf_actions(texts: Sequence[np.ndarray]) -> np.ndarray:
    """Object array [B, b1, b2, b3, b4] of leaf actions: ``parse_action(s3 of the leaf's parent, its s4)``."""
    s3, s4 = texts[2], texts[3]
    out = np.empty(s4.shape, dtype=object)
    for idx in np.ndindex(*s4.shape):
        out[idx] = parse_action(str(s3[idx[:-1]]), str(s4[idx]))
    return out


@dataclasses.dataclass
class TreeRewards:
    """The rewards of a batch of B trees, as their records show them (the round's pairs read ``preference.round.
    TreeScores``). leaf_values / exact: [B, b1..b4]; node_values: 4 arrays [B, b1..bt]
    (level 4 = leaves); classes: int32[B] (0 alpha, 1 beta, 2 gamma, -1 padding)."""

    leaf_values: np.ndarray
    exact: np.ndarray
    node_values: tuple
    classes: np.ndarray


def tree_record(
    tree,
    row: int,
    texts: Sequence[np.ndarray],
    actions: np.ndarray,
    scores: TreeRewards,
    step: Step,
    discount: float = 0.95,
) -> dict:
    """Tree ``row`` of a batch as a nested JSON-ready dict (see the module docstring)."""
    br = tuple(int(k) for k in np.asarray(tree.tokens[-1]).shape[1 : 1 + NUM_TURNS])
    lens = [np.asarray(x) for x in tree.lengths]
    logps = [np.asarray(x) for x in tree.logps]
    fins = [np.asarray(x) for x in tree.finished]

    def node(path: tuple) -> dict:
        t = len(path)
        idx = (row,) + path
        rec = {
            "turn": t,
            "index": int(path[-1]),
            "text": str(texts[t - 1][idx]),
            "num_tokens": int(lens[t - 1][idx]),
            "finished": bool(fins[t - 1][idx]),
            "logp": float(np.sum(logps[t - 1][idx])),
            "value": float(scores.node_values[t - 1][idx]),
        }
        if t == NUM_TURNS:
            a: Action = actions[idx]
            rec["action"] = a.to_json()
            rec["exact"] = bool(scores.exact[idx])
            rec["leaf"] = int(flatten_node_index(path, br))
        else:
            rec["children"] = [node(path + (k,)) for k in range(br[t])]
        return rec

    level1 = scores.node_values[0][row]
    return {
        "episode_id": str(step.episode_id),
        "step_id": int(step.step_id),
        "instruction": step.instruction,
        "history": list(step.history),
        "golden": step.action.to_json(),
        "golden_text": format_action(step.action),
        "branching": list(br),
        "class": CLASS_NAMES[int(scores.classes[row])],
        "root_value": float(discount * np.mean(level1)),
        "leaf_values": [float(v) for v in scores.leaf_values[row].reshape(-1)],
        "children": [node((k,)) for k in range(br[0])],
    }
