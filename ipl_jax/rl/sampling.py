"""Groups of G completions per prompt: CoaT by the tree sampler with branching (G, 1, 1, 1), think/answer
(UI-R1) by ``sample_single_turn``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import distributed
from ipl_jax.coat.tree import NUM_TURNS
from ipl_jax.data.image_processing import ImageProcessorConfig, preprocess_images
from ipl_jax.data.records import Step
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.inputs import ModelInputs, prepare_inputs
from ipl_jax.rl.rows import RowSpec
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.decoding import fan_out, prefill_context, sample_config_turn
from ipl_jax.sampling.keys import node_keys, step_keys, step_uid
from ipl_jax.sampling.prompts import StepPrompts, pack_tree_prompts
from ipl_jax.sampling.tree_sampler import sample_tree

# UI-R1's prompt, in our words and our action forms (the answer is parsed by ``rewards.parse_think_answer``).
UIR1_PROMPT = (
    "Task: {instruction}\nDone: {history}\nWhat is the next action on this screen? Think first, then "
    "answer as <think>...</think><answer>action</answer>. The action is one of: click <target> (x,y) | "
    'type "<text>" | scroll up/down/left/right | press back/home/enter | open_app "<app>" | wait | stop; '
    "(x,y) is the tap point, integers in 0-1000."
)


@dataclasses.dataclass(frozen=True)
class SingleTurnPrompt:
    """A one-turn prompt: prefix_ids int32[P] (up to the assistant header), pixel_values, image_grid_thw, uid."""

    prefix_ids: np.ndarray
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    uid: int = 0


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled completion: per turn its tokens int32[n_t] (end token kept), untempered log-probs f32[n_t], ended."""

    turns: tuple
    logps: tuple
    finished: tuple

    @property
    def length(self) -> int:
        return int(sum(len(t) for t in self.turns))


def think_answer_prompt(
    step: Step,
    tokenizer,
    image_config: ImageProcessorConfig,
    cfg: Qwen2VLConfig,
    template: str = UIR1_PROMPT,
    max_history: int | None = None,
    image=None,
    pixels=None,
) -> SingleTurnPrompt:
    """A step as UI-R1's single-turn prompt (rendered by the tokenizer's chat template)."""
    history = [h.strip() for h in step.history if h and h.strip()]
    if max_history is not None:
        history = history[len(history) - max_history :] if max_history > 0 else []
    text = template.format(instruction=step.instruction.strip(), history="; ".join(history) or "nothing yet")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    if pixels is None:
        pixels = preprocess_images([image if image is not None else step.load_image()], config=image_config)
    pv, grid = np.asarray(pixels[0], np.float32), np.asarray(pixels[1], np.int64).reshape(-1, 3)
    ids = tokenizer.encode(tokenizer.render(messages, add_generation_prompt=True))
    prefix = tokenizer.expand_image_tokens(ids, grid, image_config.merge_size)
    return SingleTurnPrompt(
        prefix_ids=np.asarray(prefix, np.int32),
        pixel_values=pv,
        image_grid_thw=grid,
        uid=step_uid(step.episode_id, step.step_id),
    )


# ---------------------------------------------------------------------------------------------- CoaT groups


def coat_group_config(config: SamplerConfig, group_size: int) -> SamplerConfig:
    """The tree sampler's settings for GRPO groups: branching (G, 1, 1, 1)."""
    return config.replace(branching=(int(group_size), 1, 1, 1))


def tree_completions(tree, b: int, g: int) -> list[list[Completion]]:
    """The completions of a host tree with branching (G, 1, 1, 1): [B][G]."""
    toks = [np.asarray(x).reshape(b, g, -1) for x in tree.tokens]
    lens = [np.asarray(x).reshape(b, g) for x in tree.lengths]
    lps = [np.asarray(x).reshape(b, g, -1) for x in tree.logps]
    fins = [np.asarray(x).reshape(b, g) for x in tree.finished]
    out = []
    for i in range(b):
        row = []
        for j in range(g):
            n = [int(lens[t][i, j]) for t in range(NUM_TURNS)]
            row.append(
                Completion(
                    turns=tuple(toks[t][i, j, : n[t]] for t in range(NUM_TURNS)),
                    logps=tuple(lps[t][i, j, : n[t]] for t in range(NUM_TURNS)),
                    finished=tuple(bool(fins[t][i, j]) for t in range(NUM_TURNS)),
                )
            )
        out.append(row)
    return out


def sample_coat_groups(
    params: dict,
    cfg: Qwen2VLConfig,
    items: Sequence[StepPrompts],
    config: SamplerConfig,
    seed,
    batch_size: int,
    mesh=None,
) -> list[list[Completion]]:
    """G = ``config.branching[0]`` completions for each of ``items`` (batch padded to ``batch_size``);
    [len(items)][G]."""
    if tuple(config.branching[1:]) != (1, 1, 1):
        raise ValueError(f"sample_coat_groups: branching must be (G, 1, 1, 1), got {config.branching}")
    packed = pack_tree_prompts(cfg, list(items), config, seed, batch_size=batch_size)
    tree = distributed.to_host(sample_tree(params, cfg, packed, config, mesh))
    return tree_completions(tree, batch_size, config.branching[0])[: len(items)]


def coat_row_spec(item: StepPrompts, c: Completion, with_grounding: bool, image: int) -> RowSpec:
    """The training row of a CoaT completion: prefix, s1, prompt 2, s2, prompt 3, s3 (+ prompt 4, s4)."""
    segs = [(item.prefix_ids, False), (c.turns[0], True)]
    for t in range(1, 4 if with_grounding else 3):
        segs += [(item.turn_prompt_ids[t - 1], False), (c.turns[t], True)]
    return RowSpec(segments=tuple(segs), image=image)


def state_row_spec(item: StepPrompts, end_id: int, image: int) -> RowSpec:
    """The critic's view of a state: the CoaT chat up to the thought turn's header (nothing the policy sampled)."""
    return RowSpec(
        segments=((item.prefix_ids, False), (np.asarray([end_id], np.int32), False), (item.turn_prompt_ids[0], False)),
        image=image,
    )


# ---------------------------------------------------------------------------------------------- one-turn groups


def _sample_single_turn(
    params, cfg, prefix: ModelInputs, keys, temperature, group: int, budget: int, config: SamplerConfig
):
    b = prefix.input_ids.shape[0]
    size = prefix.input_ids.shape[1] + budget
    cache, feed = prefill_context(params, cfg, prefix, size)
    cache, feed = fan_out(cache, feed, group, size)
    nk = node_keys(keys, (group, 1, 1, 1), 1).reshape(-1, 2)
    tok, n, lp, fin, _, _ = sample_config_turn(params, cfg, cache, feed, nk, budget, temperature, config)
    return tok.reshape(b, group, budget), n.reshape(b, group), lp.reshape(b, group, budget), fin.reshape(b, group)


_single_turn_jit = jax.jit(_sample_single_turn, static_argnums=(1, 5, 6, 7))


def sample_single_turn(
    params: dict,
    cfg: Qwen2VLConfig,
    items: Sequence[SingleTurnPrompt],
    group_size: int,
    config: SamplerConfig,
    seed,
    batch_size: int,
) -> list[list[Completion]]:
    """G one-turn completions (at most ``max_turn_tokens[0]``, ``temperature[0]``) per prompt; [len(items)][G]."""
    items = list(items)
    if not items or len(items) > batch_size:
        raise ValueError(f"sample_single_turn: need 1..{batch_size} prompts, got {len(items)}")
    rows = items + [items[-1]] * (batch_size - len(items))
    p = config.prefix_bucket(max(len(r.prefix_ids) for r in rows))
    ids = np.full((batch_size, p), config.pad_id, np.int32)
    mask = np.zeros((batch_size, p), bool)
    for i, r in enumerate(rows):
        ids[i, : len(r.prefix_ids)], mask[i, : len(r.prefix_ids)] = r.prefix_ids, True
    prefix = prepare_inputs(
        cfg,
        ids,
        mask,
        np.concatenate([r.pixel_values for r in rows]),
        np.concatenate([r.image_grid_thw for r in rows]),
        text_buckets=(p,),
        patch_buckets=config.patch_buckets,
        pad_id=config.pad_id,
    )
    keys = jnp.asarray(step_keys(seed, [r.uid for r in rows]))
    temperature = jnp.asarray(config.temperature[0], jnp.float32)
    tok, n, lp, fin = distributed.to_host(
        _single_turn_jit(
            params,
            cfg,
            prefix,
            keys,
            temperature,
            int(group_size),
            int(config.max_turn_tokens[0]),
            config.compile_key(),
        )
    )
    return [
        [
            Completion(turns=(tok[i, j, : n[i, j]],), logps=(lp[i, j, : n[i, j]],), finished=(bool(fin[i, j]),))
            for j in range(group_size)
        ]
        for i in range(len(items))
    ]


def single_turn_row_spec(item: SingleTurnPrompt, c: Completion, image: int) -> RowSpec:
    return RowSpec(segments=((item.prefix_ids, False), (c.turns[0], True)), image=image)
