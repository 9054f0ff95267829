"""Stage ``evolution``: instruction evolution (docs/method.md §2), filtered Q&A about the training screens that
warm-up SFT learns beside the CoaT."""

from __future__ import annotations

import collections
import random
from collections.abc import Sequence

from ipl_jax.data.evolution import evolve_steps, filter_qas, write_qas_jsonl
from ipl_jax.data.records import Step
from ipl_jax.pipeline.workdir import Workdir
from ipl_jax.progress import progress
from ipl_jax.settings import EvolutionSettings


def evolve(evolution: EvolutionSettings, seed: int, wd: Workdir, train_steps: Sequence[Step]) -> dict:
    """Filtered Q&A about the training screens, capped at ``max_items``, in
    ``WORKDIR/evolution/qas.jsonl`` (empty when evolution is off)."""
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
