"""Stage ``buckets``: the shape buckets checked against the data the job reads, before any training.

A length over its field's largest bucket adds one bucket (rounded up to ``ROUND``) that the job then uses
(``apply``); with ``buckets.fixed`` it stops with a one-line ``UsageError`` instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ipl_jax import storage
from ipl_jax.data.dialogue import annotated_steps, coat_example, coat_segments, qa_example
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.data.screenshots import screen_pixels, step_name
from ipl_jax.data.tokenizer import load_tokenizer
from ipl_jax.pipeline import data_stage, sft_stage
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.workdir import Workdir, read_json
from ipl_jax.progress import progress
from ipl_jax.settings import GOLDEN_METHODS, RL_METHODS, IPLSettings, Settings

ROUND = 64  # an added bucket: the longest length rounded up to a multiple of this (a multiple of 2x2 patches)
STAGE = "buckets"
WHAT = {  # bucket field -> what its lengths are
    "buckets.tokens": "SFT token length",
    "buckets.patches": "image patches",
    "sampler.tree.prefix_buckets": "sampler prefix length",
    "sampler.tree.prompt_buckets": "turn prompt length",
    "ipl.text_buckets": "packed T-DPO row length (bound)",
}


@dataclasses.dataclass(frozen=True)
class Longest:
    """The longest length of one bucket ``field`` (dotted settings name) and the example that has it."""

    field: str
    length: int
    example: str


class LengthScan:
    """The longest length per bucket field seen so far (the first example on ties)."""

    def __init__(self):
        self.longest: dict[str, Longest] = {}

    def add(self, field: str, length: int, example: str) -> None:
        if field not in WHAT:
            raise ValueError(f"LengthScan: unknown bucket field {field!r} (known: {', '.join(WHAT)})")
        best = self.longest.get(field)
        if best is None or int(length) > best.length:
            self.longest[field] = Longest(field, int(length), example)


# ------------------------------------------------------------------------------------------- the decision


def buckets_of(settings: Settings, field: str) -> tuple[int, ...]:
    """The buckets of the dotted ``field`` (``sampler.tree.prefix_buckets``)."""
    node = settings
    for name in field.split("."):
        node = getattr(node, name)
    return tuple(node)


def round_up(n: int, multiple: int = ROUND) -> int:
    return -(-int(n) // multiple) * multiple


def fit(settings: Settings, longest: Iterable[Longest]) -> dict[str, list[int]]:
    """The buckets to change: {field: buckets with one appended} per length over its largest bucket (empty when the
    data fit). With ``buckets.fixed`` the first such length raises ``UsageError``."""
    changed: dict[str, list[int]] = {}
    for item in longest:
        current = buckets_of(settings, item.field)
        if item.length <= max(current):
            continue
        grown = [*current, round_up(item.length)]
        if settings.buckets.fixed:
            raise UsageError(
                f"{WHAT[item.field]} of example {item.example} is {item.length}, over the largest bucket "
                f"{max(current)} of config.{item.field} (fix it with --config.{item.field}="
                f"({','.join(map(str, grown))}), or let the job add it: --config.buckets.fixed=false)"
            )
        changed[item.field] = grown
    return changed


def apply(settings: Settings, summary: dict | None) -> Settings:
    """``settings`` with the buckets the stage's ``summary`` changed (the same settings when none changed)."""
    changed = (summary or {}).get("changed") or {}
    return settings.replace({k: tuple(v) for k, v in changed.items()}) if changed else settings


def read_fitted(workdir: str | Path) -> dict:
    """The summary of a job's ``buckets`` stage; UsageError when it has none (or its URI cannot be reached)."""
    try:
        storage.check_location(workdir)
    except storage.LocationError as e:
        raise UsageError(f"--workdir {e}") from None
    wd = storage.as_path(workdir)  # a local directory or a URI
    marker = wd / "stages" / f"{STAGE}.done"
    if not marker.is_file():
        raise UsageError(f"--workdir {wd}: no finished buckets stage ({marker} is missing); run the job past it first")
    return read_json(marker)


def describe(settings: Settings, longest: dict[str, Longest], changed: dict[str, list[int]]) -> str:
    """The stage's one line: what was added (and why), or that the data fit, with each longest length."""
    if changed:
        parts = [
            f"{f} + {v[-1]} ({WHAT[f]} {longest[f].length} of example {longest[f].example} > {max(v[:-1])})"
            for f, v in changed.items()
        ]
        return "  buckets grown to fit the data: " + "; ".join(parts) + " (buckets.fixed=true stops instead)"
    parts = [f"{WHAT[f]} {x.length} <= {max(buckets_of(settings, f))}" for f, x in longest.items()]
    return "  buckets: the data fit (" + ", ".join(parts) + ")"


# ------------------------------------------------------------------------------------------------ lengths


def tdpo_row_bound(
    prefix: int, prompts: Sequence[int], golden: dict[int, int], branching: Sequence[int], turn_tokens, ipl: IPLSettings
) -> int:
    """The longest packed T-DPO row a step's pairs can make: a group's prefix less its last token (turns at their
    budgets ``turn_tokens``) plus every continuation (b_t siblings, plus the golden ``golden[t]`` on turns 3-4).
    prompts: the turn-2, -3, -4 prompt lengths."""
    whole = sum(turn_tokens) + sum(prompts)
    if ipl.method == "naive_dpo":
        return prefix - 1 + 2 * whole
    gamma = {3: ipl.gamma_pairs in ("paper", "consistent"), 4: ipl.gamma_pairs != "none"}
    rows = []
    for t in ipl.pair_turns:
        before = sum(turn_tokens[level - 1] + prompts[level - 1] for level in range(1, t))
        siblings = branching[t - 1] * turn_tokens[t - 1] + (golden.get(t, 0) if gamma.get(t) else 0)
        rows.append(prefix - 1 + before + siblings)
    return max(rows)


def _stand_in(grid) -> tuple[np.ndarray, np.ndarray]:
    """Pixels that only carry the grid (token ids need the image size, not its values)."""
    return np.zeros((0, 1), np.float32), np.asarray(grid, np.int64).reshape(-1, 3)


class _Grids:
    """Each screenshot's patch grid read once from its header (steps by episode / step id)."""

    def __init__(self, image_config: ImageProcessorConfig):
        self.image_config, self.grids = image_config, {}

    def __call__(self, step: Step) -> np.ndarray:
        key = (str(step.episode_id), int(step.step_id))
        if key not in self.grids:
            self.grids[key] = screen_pixels(step, self.image_config).grid
        return self.grids[key]


def sft_lengths(items, tokenizer, image_config: ImageProcessorConfig, grids, fallback: bool = False):
    """(token length, example name) of each SFT item (``sft_stage.SFTItem``), as the loader tokenises it."""
    for item in items:
        pixels = _stand_in(grids(item.step))
        if item.qa is None:
            ex = coat_example(item.step, tokenizer, image_config, pixels=pixels, fallback=fallback)
        else:
            qa = item.qa
            name = f"qa {qa.episode_id}/{qa.step_id}/{qa.kind}"
            ex = qa_example(tokenizer, image_config, None, qa.question, qa.answer, name=name, pixels=pixels)
        yield len(ex), ex.name


def scan(
    settings: Settings,
    tokenizer,
    image_config: ImageProcessorConfig,
    steps: Sequence[Step],
    sft_items: Sequence,
    tdpo_steps: Sequence[Step],
) -> LengthScan:
    """The longest lengths of the job: SFT tokens of ``sft_items``; patches, sampler prefix and prompts of ``steps``;
    the T-DPO row bound of ``tdpo_steps`` (empty: no packed rounds)."""
    out = LengthScan()
    grids = _Grids(image_config)
    for length, name in sft_lengths(sft_items, tokenizer, image_config, grids, settings.data.coat_fallback):
        out.add("buckets.tokens", length, name)
    packed = {(str(s.episode_id), int(s.step_id)) for s in tdpo_steps}
    turn_tokens = settings.buckets.max_turn_tokens
    for step in progress(steps, desc="buckets", unit="step"):
        grid = grids(step)
        seg = coat_segments(step, tokenizer, image_config, pixels=_stand_in(grid))
        name = step_name(step)
        prompts = [len(seg.turn_prompt_ids[t]) for t in (2, 3, 4)]
        out.add("buckets.patches", int(np.prod(grid, axis=1).max()), name)
        out.add("sampler.tree.prefix_buckets", len(seg.prefix_ids), name)
        out.add("sampler.tree.prompt_buckets", max(prompts), name)
        if (str(step.episode_id), int(step.step_id)) in packed:
            golden = {t: len(ids) for t, ids in seg.target_ids.items() if t in (3, 4)}
            bound = tdpo_row_bound(
                len(seg.prefix_ids), prompts, golden, settings.sampler.tree.branching, turn_tokens, settings.ipl
            )
            out.add("ipl.text_buckets", bound, name)
    return out


# ---------------------------------------------------------------------------------------------- the stage


def _unique(steps: Iterable[Step]) -> list[Step]:
    seen, out = set(), []
    for s in steps:
        key = (str(s.episode_id), int(s.step_id))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def fit_stage(
    settings: Settings,
    wd: Workdir,
    splits: dict,
    train_steps: Sequence[Step],
    round_pool: Sequence[Step],
    qas: Sequence,
) -> dict:
    """Stage ``buckets`` (every process): scan with ``WORKDIR/model/init``'s tokenizer, ``fit``, echo one line."""
    policy_dir = storage.local_dir(wd.path("model", "init"))  # this host's copy of a URI
    tokenizer, image_config = load_tokenizer(policy_dir), ImageProcessorConfig.load(policy_dir)
    ipl, fallback = settings.ipl, settings.data.coat_fallback
    items: list = []
    if settings.sft.steps > 0:
        items = sft_stage.sft_items(train_steps, qas, fallback, round_pool)[0]
    if ipl.method == "sft_oracle":  # the annotations of the action-only steps, read back from the dataset
        oracle = data_stage.oracle_steps(settings.data, wd, round_pool)
        items += [sft_stage.SFTItem(s) for s in annotated_steps(oracle, fallback)[0]]
    elif ipl.method in GOLDEN_METHODS and settings.sft.steps == 0:
        items += [sft_stage.SFTItem(s) for s in annotated_steps(train_steps, fallback)[0]]
    steps = _unique(s for episodes in splits.values() for e in episodes for s in e.steps)
    tdpo: list[Step] = []
    if ipl.rounds > 0 and ipl.method not in RL_METHODS:
        tdpo = list(round_pool)
        if ipl.diagnostics and ipl.heldout_steps > 0:
            tdpo += data_stage.steps_of(splits[settings.data.dev_name])
    longest = scan(settings, tokenizer, image_config, steps, items, tdpo).longest
    changed = fit(settings, longest.values())
    wd.echo(describe(settings, longest, changed))
    return {
        "fixed": settings.buckets.fixed,
        "scanned": {"steps": len(steps), "sft_examples": len(items), "tdpo_steps": len(tdpo)},
        "longest": {
            f: {"length": x.length, "example": x.example, "largest_bucket": max(buckets_of(settings, f))}
            for f, x in longest.items()
        },
        "changed": changed,
    }
