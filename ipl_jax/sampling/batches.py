"""Sampling trees for a list of steps in fixed-shape batches (the last batch padded), for the commands."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import jax

from ipl_jax import distributed
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.sampling.config import SamplerConfig
from ipl_jax.sampling.prompts import StepPrompts, pack_tree_prompts, step_prompts
from ipl_jax.sampling.tree_sampler import prompt_vision_rows, sample_tree


@dataclasses.dataclass
class SampledBatch:
    """One batch: ``tree`` (host CoaTTree, B rows), its rows' ``steps`` and ``prompts`` (padding rows repeat the
    last real step, ``tree.step_valid`` False), ``start`` (first row's index in the caller's list)."""

    tree: object
    steps: list
    prompts: list
    start: int

    @property
    def num_valid(self) -> int:
        return int(sum(bool(v) for v in self.tree.step_valid))


def iter_sampled_batches(
    params: dict,
    cfg: Qwen2VLConfig,
    tokenizer,
    image_config: ImageProcessorConfig,
    steps: Sequence[Step],
    config: SamplerConfig,
    seed,
    batch_size: int,
    mesh: jax.sharding.Mesh | None = None,
) -> Iterator[SampledBatch]:
    """Sample one tree per step, ``batch_size`` steps per jitted call. Under a mesh with ``config.image_patches``
    this process decodes only its devices' rows' screenshots.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    steps = list(steps)
    vision_rows = prompt_vision_rows(batch_size, mesh, config)
    for start in range(0, len(steps), batch_size):
        chunk = steps[start : start + batch_size]
        items: list[StepPrompts] = [step_prompts(s, tokenizer, image_config, cfg) for s in chunk]
        packed = pack_tree_prompts(
            cfg,
            items,
            config,
            seed,
            step_index=range(start, start + len(chunk)),
            batch_size=batch_size,
            vision_rows=vision_rows,
        )
        tree = distributed.to_host(sample_tree(params, cfg, packed, config, mesh))
        pad = batch_size - len(chunk)
        yield SampledBatch(tree=tree, steps=chunk + [chunk[-1]] * pad, prompts=items + [items[-1]] * pad, start=start)
