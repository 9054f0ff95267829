"""Stages 1 and 2: the dataset (synthetic world written in the AITZ format, or a real benchmark read from disk)
and instruction evolution on the training screens.

Synthetic data is written under ``WORKDIR/data/<split>`` with ``write_aitz_split`` and always read back with
``load_aitz``, so the rest of the job sees exactly what it would see on real AITZ data
(``config.data.format == "aitz"`` with ``config.data.root`` pointing at it).

Scarce annotations (``data.action_episodes`` M > 0): of the training episodes, a seeded choice of
``data.annotated_episodes`` N keep their CoaT (warm-up SFT, evolution, the ``continued_sft`` control) and M
others become action logs as they are read (``strip_annotation``: the golden action, screen and history only),
returned as the pseudo-split ``train_actions`` that the IPL rounds sample. With ``data.action_root`` the logs are
the training episodes of that second dataset instead (``action_logs``: M of them, 0 all; N of ``data.root``'s,
0 all), checked against the first before anything is written. Only ``oracle_steps`` (the ``sft_oracle`` upper
bound) reads their annotations back, from the dataset that holds them.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ipl_jax.data.datasets import load_dataset, load_dataset_with_report, skipped_summary
from ipl_jax.data.dialogue import has_coat
from ipl_jax.data.evolution import evolve_steps, filter_qas, write_qas_jsonl
from ipl_jax.data.packed.writer import pack_dataset
from ipl_jax.data.records import Episode, Step
from ipl_jax.data.synthetic import generate_split
from ipl_jax.data.synthetic.aitz_writer import write_aitz_split
from ipl_jax.data.synthetic.dataset import episode_id
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.progress import progress
from ipl_jax.settings import DataSettings, EvolutionSettings, Settings

TRAIN, DEV = "train", "dev"
ACTIONS = "train_actions"  # the action-only training episodes of a scarce-annotation job (not a split on disk)


# ------------------------------------------------------------------------------------------------ the splits


def write_synthetic(settings: Settings, wd: Workdir) -> dict:
    """Stage 1 (synthetic): generate every split with the synthetic world (``world``, ``seed``) and write it in
    the AITZ layout.

    With ``data.store == "arrayrecord"`` the AITZ splits are packed into ArrayRecord shards in ``WORKDIR/data``
    (``data.shards`` per split) and the AITZ files removed: the job then reads exactly the same steps, through
    Grain's ArrayRecord source."""
    data = settings.data
    if data.action_root:  # a bad mix of the two datasets stops here, before the world is written
        action_logs(data, settings.seed, synthetic_ids(data, settings.seed), "the synthetic world", lambda _: None)
    packed = data.store == "arrayrecord"
    out = wd.dir("data")
    root = wd.dir("data_aitz") if packed else out
    summary: dict = {"root": str(out), "splits": {}}
    for split in data.split_names():
        episodes = generate_split(split, data.episodes_for(split), seed=settings.seed, config=settings.world)
        if (root / split).exists():  # what an interrupted attempt left: never mix its episodes with these
            shutil.rmtree(root / split)
        write_aitz_split(
            progress(episodes, desc=f"data {split}", unit="episode"), root, split, compress_level=data.png_level
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
        meta = pack_dataset("synthetic", root, out, shards=data.shards)
        shutil.rmtree(root)
        summary["arrayrecord"] = {k: len(v["files"]) for k, v in meta["splits"].items()}
        wd.echo(f"  packed into ArrayRecord shards in {out}")
    return summary


def data_root(data: DataSettings, wd: Workdir) -> Path:
    return wd.path("data") if data.synthetic else Path(data.root)


def load_splits(data: DataSettings, wd: Workdir, seed: int) -> dict[str, list[Episode]]:
    """Every split as episodes, read from disk with the format's reader (synthetic data is AITZ).

    Without a dev split (real AITZ has none), the last ``data.dev_holdout`` training episodes are held out as
    dev. With ``data.skip_bad`` malformed records are left out (and counted, by field) instead of stopping the
    job. With ``data.action_root`` N training episodes are kept and the action logs read from that root
    (``action_logs``); else with ``data.action_episodes`` the training split is cut into annotated episodes and
    action logs (``split_annotations``). Both choices are seeded by ``seed``.
    """
    fmt = "aitz" if data.synthetic else data.format
    root = data_root(data, wd)
    out = {}
    for split in data.split_names():
        out[split], skipped = load_dataset_with_report(root, fmt, split, skip_bad=data.skip_bad)
        if skipped:
            wd.echo(f"  {skipped_summary(skipped, f'{root} split {split!r}')}")
    for split, eps in out.items():
        if not eps:
            raise ValueError(f"{root}: split {split!r} has no episodes")
    if not data.dev_split:
        n = max(1, data.dev_holdout)
        if len(out[TRAIN]) <= n:
            raise ValueError(f"{root}: {len(out[TRAIN])} training episodes cannot spare {n} for dev")
        out[DEV] = out[TRAIN][-n:]
        out[TRAIN] = out[TRAIN][:-n]
    if data.action_root:
        where = "the synthetic world" if data.synthetic else f"config.data.root={data.root!r}"
        taken = {e.episode_id: split for split, eps in out.items() for e in eps}
        out[TRAIN] = _seeded(out[TRAIN], data.annotated_episodes, seed, "annotated_episodes", where)
        out[ACTIONS] = action_logs(data, seed, taken, where, wd.echo)
    elif data.action_episodes:
        out[TRAIN], out[ACTIONS] = split_annotations(
            out[TRAIN], data.annotated_episodes, data.action_episodes, seed, str(root)
        )
    return out


# ------------------------------------------------------------------------------------ scarce annotations


# what an action log keeps of a step's meta: where it comes from, never the file that holds its annotation
_LOG_META = ("dataset", "subset", "episode_id", "step_id", "history_gap")


def strip_annotation(step: Step) -> Step:
    """A step as an action log holds it: screenshot, UI elements, instruction, history and the golden action;
    no CoaT, no step instruction, no pointer to the annotated record."""
    meta = {k: v for k, v in step.meta.items() if k in _LOG_META}
    return dataclasses.replace(step, coat=None, step_instruction=None, meta=meta)


def split_annotations(
    episodes: Sequence[Episode], annotated: int, actions: int, seed: int, where: str = "data"
) -> tuple[list[Episode], list[Episode]]:
    """(N annotated episodes as read, M others stripped to action logs), chosen by a seeded permutation and
    each kept in reading order. Raises ``UsageError`` (one line) when N < 1 or N + M exceeds the episodes."""
    if annotated < 1 or actions < 0 or annotated + actions > len(episodes):
        raise UsageError(
            f"{where}: data.annotated_episodes={annotated} + data.action_episodes={actions} must be >= 1 annotated "
            f"and at most the {len(episodes)} training episodes"
        )
    order = np.random.default_rng(seed).permutation(len(episodes))
    keep, logs = sorted(order[:annotated].tolist()), sorted(order[annotated : annotated + actions].tolist())
    return [episodes[i] for i in keep], [strip_episode(episodes[i]) for i in logs]


def strip_episode(episode: Episode) -> Episode:
    """An episode as an action log: every step ``strip_annotation``-ed, no pointer to the annotated record."""
    return dataclasses.replace(
        episode,
        steps=tuple(strip_annotation(s) for s in episode.steps),
        meta={k: v for k, v in episode.meta.items() if k in _LOG_META},
    )


def _seeded(episodes: Sequence[Episode], n: int, seed, field: str, where: str) -> list[Episode]:
    """A seeded choice of ``n`` episodes (0: all), kept in reading order; ``UsageError`` when there are fewer."""
    if n > len(episodes):
        raise UsageError(
            f"config.data.{field}={n}: exceeds the {len(episodes)} training episodes of {where} (0: all of them)"
        )
    if n == 0:
        return list(episodes)
    return [episodes[i] for i in sorted(np.random.default_rng(seed).permutation(len(episodes))[:n].tolist())]


def synthetic_ids(data: DataSettings, seed: int) -> dict[str, str]:
    """{episode id: split} of every split the synthetic world's job writes (known before it is written)."""
    return {episode_id(s, seed, i): s for s in data.split_names() for i in range(data.episodes_for(s))}


def action_logs(
    data: DataSettings, seed: int, taken: Mapping[str, str], where: str, echo: Callable[[str], None]
) -> list[Episode]:
    """The action logs of a two-dataset job: ``data.action_episodes`` M (0: all) training episodes of
    ``data.action_root`` read as ``data.log_format``, a seeded choice kept in reading order, each
    ``strip_episode``-d. ``taken`` maps the episode ids of the annotated dataset (``where``) to their splits.
    Raises ``UsageError`` (one line) when the root holds no training episode or fewer than M, or shares an
    episode id with the annotated dataset."""
    root, fmt = data.action_root, data.log_format
    here = f"config.data.action_root={root!r}"
    episodes, skipped = load_dataset_with_report(root, fmt, TRAIN, skip_bad=data.skip_bad)
    if skipped:
        echo(f"  {skipped_summary(skipped, f'{root} split {TRAIN!r}')}")
    if not episodes:
        raise UsageError(
            f"{here}: its {TRAIN} split holds no episodes (read as {fmt}); pass a dataset whose training split holds "
            f"action logs"
        )
    shared = [e.episode_id for e in episodes if e.episode_id in taken]
    if shared:
        raise UsageError(
            f"{here}: episode {shared[0]} is also in the {taken[shared[0]]} split of {where} ({len(shared)} shared "
            f"episode{'s' * (len(shared) > 1)}); an episode is annotated or an action log, never both: take it out "
            f"of one of the datasets"
        )
    chosen = _seeded(episodes, data.action_episodes, [seed, 1], "action_episodes", here)  # apart from N's stream
    return [strip_episode(e) for e in chosen]


def check_annotations(settings: Settings, train_steps: Sequence[Step]) -> None:
    """Before any training: warm-up SFT needs training steps with CoaT (or ``data.coat_fallback``)."""
    if settings.sft.steps > 0 and not settings.data.coat_fallback:
        if not any(has_coat(s) for s in train_steps):
            raise UsageError(
                f"config.data.coat_fallback=False: none of the {len(train_steps)} training steps carries a CoaT "
                f"annotation, so warm-up SFT has nothing to train on (fix it with --config.data.coat_fallback=true "
                f"to make up their texts, or give annotated data)"
            )


def oracle_steps(data: DataSettings, wd: Workdir, steps: Sequence[Step]) -> list[Step]:
    """The annotated records of action-only ``steps``, read back from the dataset that holds them (``action_root``
    as ``log_format`` in a two-dataset job): only the ``sft_oracle`` upper bound calls this. Raises ``UsageError``
    (one line) naming a step the training split lacks or that has no CoaT there."""
    if data.action_root:
        root, fmt = Path(data.action_root), data.log_format
    else:
        root, fmt = data_root(data, wd), "aitz" if data.synthetic else data.format
    episodes = load_dataset(root, fmt, TRAIN, skip_bad=data.skip_bad)
    by_key = {(str(s.episode_id), int(s.step_id)): s for e in episodes for s in e.steps}
    out = []
    for s in steps:
        full = by_key.get((str(s.episode_id), int(s.step_id)))
        if full is None or not has_coat(full):
            raise UsageError(
                f"{root}: episode {s.episode_id} step {s.step_id} has no CoaT annotation in split {TRAIN!r} ({fmt}); "
                f"the sft_oracle variant needs the annotations of the action-only episodes"
            )
        out.append(full)
    return out


def steps_of(episodes: Sequence[Episode]) -> list[Step]:
    return [s for e in episodes for s in e.steps]


# ------------------------------------------------------------------------------------------ instruction evolution


def evolve(evolution: EvolutionSettings, seed: int, wd: Workdir, train_steps: Sequence[Step]) -> dict:
    """Stage 2: Q&A about the training screens (three levels), filtered, capped at ``max_items``; written to
    ``WORKDIR/evolution/qas.jsonl``. With evolution disabled an empty file is written."""
    path = wd.dir("evolution") / "qas.jsonl"
    if not evolution.enabled:
        write_qas_jsonl(path, [])
        return {"enabled": False, "generated": 0, "kept": 0, "path": str(path)}
    raw = evolve_steps(
        progress(train_steps, desc="evolution", unit="screen"),
        seed=seed,
        levels=evolution.levels,
        per_step=evolution.per_step,
    )
    kept, counts = filter_qas(raw)
    cap = evolution.max_items
    if cap and len(kept) > cap:
        # a seeded sample, kept in step order
        chosen = sorted(random.Random(seed).sample(range(len(kept)), cap))
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
