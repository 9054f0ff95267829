"""Stages 1 and 2: the dataset (synthetic world written in the AITZ format, or a real benchmark read from disk)
and instruction evolution on the training screens.

Synthetic data is written under ``WORKDIR/data/<split>`` with ``write_aitz_split`` and always read back with
``load_aitz``, so the rest of the job sees exactly what it would see on real AITZ data
(``config.data.format == "aitz"`` with ``config.data.root`` pointing at it).
"""

from __future__ import annotations

import collections
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from ipl_jax.data.records import Episode, Step
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.progress import progress

TRAIN, DEV = "train", "dev"


# ------------------------------------------------------------------------------------------------ the splits


def split_names(config: ml_collections.ConfigDict) -> list[str]:
    """Every split the job reads: train, dev (when configured) and the test splits."""
    names = [TRAIN] + ([config.data.dev_split] if config.data.dev_split else []) + list(config.data.test_splits)
    seen, out = set(), []
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def episodes_for(config: ml_collections.ConfigDict, split: str) -> int:
    if split == TRAIN:
        return int(config.data.train_episodes)
    if split == config.data.dev_split:
        return int(config.data.dev_episodes)
    return int(config.data.test_episodes)


def write_synthetic(config: ml_collections.ConfigDict, wd: Workdir) -> dict:
    """Stage 1 (synthetic): generate every split with the synthetic world and write it in the AITZ layout.

    With ``config.data.store == "arrayrecord"`` the AITZ splits are packed into ArrayRecord shards in
    ``WORKDIR/data`` (``config.data.shards`` per split) and the AITZ files removed: the job then reads exactly the
    same steps, through Grain's ArrayRecord source."""
    from ipl_jax.data.synthetic import generate_split
    from ipl_jax.data.synthetic.aitz_writer import write_aitz_split
    from ipl_jax.data.synthetic.config import world_config

    world = world_config(config.world)
    packed = str(config.data.get("store", "aitz")) == "arrayrecord"
    out = wd.dir("data")
    root = wd.dir("data_aitz") if packed else out
    summary: dict = {"root": str(out), "splits": {}}
    for split in split_names(config):
        episodes = generate_split(split, episodes_for(config, split), seed=int(config.seed), config=world)
        if (root / split).exists():  # what an interrupted attempt left: never mix its episodes with these
            shutil.rmtree(root / split)
        write_aitz_split(
            progress(episodes, desc=f"data {split}", unit="episode"),
            root,
            split,
            compress_level=int(config.data.png_level),
        )
        types = collections.Counter(s.action.type for e in episodes for s in e.steps)
        summary["splits"][split] = {
            "episodes": len(episodes),
            "steps": sum(types.values()),
            "action_types": dict(sorted(types.items())),
        }
        wd.echo(
            f"  {split}: {len(episodes)} episodes, {sum(types.values())} steps "
            f"({', '.join(f'{k} {v}' for k, v in sorted(types.items()))})"
        )
    if packed:
        from ipl_jax.data.packed import pack_dataset

        meta = pack_dataset("synthetic", root, out, shards=int(config.data.get("shards", 1)))
        shutil.rmtree(root)
        summary["arrayrecord"] = {k: len(v["files"]) for k, v in meta["splits"].items()}
        wd.echo(f"  packed into ArrayRecord shards in {out}")
    return summary


def data_root(config: ml_collections.ConfigDict, wd: Workdir) -> Path:
    return wd.path("data") if config.data.format == "synthetic" else Path(config.data.root)


def load_splits(config: ml_collections.ConfigDict, wd: Workdir) -> dict[str, list[Episode]]:
    """Every split as episodes, read from disk with the format's reader (synthetic data is AITZ).

    Without a dev split (real AITZ has none), the last ``config.data.dev_holdout`` training episodes are held
    out as dev. With ``config.data.skip_bad`` malformed records are left out (and counted, by field) instead of
    stopping the job.
    """
    from ipl_jax.data.datasets import load_dataset_with_report, skipped_summary

    fmt = "aitz" if config.data.format == "synthetic" else config.data.format
    root = data_root(config, wd)
    if config.data.format != "synthetic" and not str(config.data.root):
        raise ValueError(f"config.data.root must name the {fmt} dataset directory")
    skip_bad = bool(config.data.get("skip_bad", False))
    out = {}
    for split in split_names(config):
        out[split], skipped = load_dataset_with_report(root, fmt, split, skip_bad=skip_bad)
        if skipped:
            wd.echo(f"  {skipped_summary(skipped, f'{root} split {split!r}')}")
    for split, eps in out.items():
        if not eps:
            raise ValueError(f"{root}: split {split!r} has no episodes")
    if not config.data.dev_split:
        n = max(1, int(config.data.dev_holdout))
        if len(out[TRAIN]) <= n:
            raise ValueError(f"{root}: {len(out[TRAIN])} training episodes cannot spare {n} for dev")
        out[DEV] = out[TRAIN][-n:]
        out[TRAIN] = out[TRAIN][:-n]
    return out


def dev_name(config: ml_collections.ConfigDict) -> str:
    return config.data.dev_split or DEV


def steps_of(episodes: Sequence[Episode]) -> list[Step]:
    return [s for e in episodes for s in e.steps]


def scoring_format(config: ml_collections.ConfigDict) -> str:
    """The metric table's format: the dataset's own (synthetic data is scored as AITZ; packed and TFDS data name
    theirs in their metadata)."""
    from ipl_jax.data.datasets import scoring_format as rules_format

    return rules_format(str(config.data.format), str(config.data.root))


# ------------------------------------------------------------------------------------------ instruction evolution


def evolve(config: ml_collections.ConfigDict, wd: Workdir, train_steps: Sequence[Step]) -> dict:
    """Stage 2: Q&A about the training screens (three levels), filtered, capped at ``max_items``; written to
    ``WORKDIR/evolution/qas.jsonl``. With evolution disabled an empty file is written."""
    from ipl_jax.data.evolution import evolve_steps, filter_qas, write_qas_jsonl

    path = wd.dir("evolution") / "qas.jsonl"
    if not config.evolution.enabled:
        write_qas_jsonl(path, [])
        return {"enabled": False, "generated": 0, "kept": 0, "path": str(path)}
    raw = evolve_steps(
        progress(train_steps, desc="evolution", unit="screen"),
        seed=int(config.seed),
        levels=tuple(config.evolution.levels),
        per_step=int(config.evolution.per_step),
    )
    kept, counts = filter_qas(raw)
    cap = int(config.evolution.max_items)
    if cap and len(kept) > cap:
        # a seeded sample, kept in step order
        chosen = sorted(random.Random(int(config.seed)).sample(range(len(kept)), cap))
        kept = [kept[i] for i in chosen]
    write_qas_jsonl(path, kept)
    by_level = collections.Counter(q.level for q in kept)
    by_kind = collections.Counter(q.kind for q in kept)
    dropped = {k: v for k, v in counts.items() if k != "kept" and v}
    wd.echo(
        f"  {len(raw)} Q&A generated on {len(train_steps)} screens, {counts['kept']} pass the filter "
        f"(dropped: {dropped or 'none'}), {len(kept)} used; by level "
        + ", ".join(f"L{k} {v}" for k, v in sorted(by_level.items()))
    )
    return {
        "enabled": True,
        "generated": len(raw),
        "passed_filter": counts["kept"],
        "kept": len(kept),
        "filter": counts,
        "by_level": {str(k): v for k, v in sorted(by_level.items())},
        "by_kind": dict(sorted(by_kind.items())),
        "path": str(path),
    }
