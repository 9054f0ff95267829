"""Plots of a job's results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ipl_jax import storage

TYPE_ROWS = ("CLICK", "TYPE", "SCROLL", "PRESS", "STOP")


def split_total_series(rounds: Sequence[dict], splits: Sequence[str]) -> dict[str, list]:
    """{split: [total exact accuracy or None per round]} for each of ``splits``, and ``mean``: their mean per round
    (None unless every split was evaluated that round)."""
    out: dict[str, list] = {
        s: [((r["metrics"].get(s) or {}).get("total") or {}).get("exact_acc") for r in rounds] for s in splits
    }
    per_round = list(zip(*(out[s] for s in splits))) if splits else [() for _ in rounds]
    out["mean"] = [None if not v or any(x is None for x in v) else sum(v) / len(v) for v in per_round]
    return out


def pooled_type_series(rounds: Sequence[dict], splits: Sequence[str]) -> dict[str, list]:
    """{action type: [exact accuracy over the steps of that type in all ``splits`` together, or None per round]}
    (each split's accuracy weighted by its count of that type)."""
    out: dict[str, list] = {}
    for row in TYPE_ROWS:
        values = []
        for r in rounds:
            cells = [(r["metrics"].get(s) or {}).get(row) or {} for s in splits]
            n = sum(int(c.get("count") or 0) for c in cells if c.get("exact_acc") is not None)
            hits = sum(
                float(c["exact_acc"]) * int(c.get("count") or 0) for c in cells if c.get("exact_acc") is not None
            )
            values.append(hits / n if n else None)
        out[row] = values
    return out


def _lines(ax, xs: Sequence[int], series: dict[str, list], bold: str) -> None:
    for name, values in series.items():
        pts = [(x, 100.0 * v) for x, v in zip(xs, values) if v is not None]
        if not pts:
            continue
        style = dict(linewidth=2.6, color="black", marker="o") if name == bold else dict(linewidth=1.4, marker=".")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name.lower() if name in TYPE_ROWS else name, **style)


def plot_step_accuracy_splits(
    rounds: Sequence[dict], splits: Sequence[str], out: str | Path, exported: int | None = None
) -> Path:
    """A PNG of step accuracy (%) across rounds (round 0 = the starting policy; a round without test scores has no
    point): left, each test split's total and their mean (bold); right, each action type over the splits' steps
    together. A dotted line marks the ``exported`` round."""
    import matplotlib  # a second to import: only the export stage draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [int(r["round"]) for r in rounds]
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0), dpi=110, sharey=True)
    _lines(axes[0], xs, split_total_series(rounds, splits), bold="mean")
    _lines(axes[1], xs, pooled_type_series(rounds, splits), bold="")
    titles = ("Step accuracy by test split", f"By action type ({len(splits)} splits' steps together)")
    for ax, title in zip(axes, titles):
        if exported is not None:
            ax.axvline(exported, color="grey", linestyle=":", linewidth=1.2, label=f"exported (round {exported})")
        ax.set_xlabel("IPL round (0 = starting policy)")
        ax.set_xticks(xs)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.set_title(title, fontsize=10)
        ax.legend(loc="best", fontsize=8, ncol=2)
    axes[0].set_ylabel("step accuracy (%)")
    fig.tight_layout()
    out = storage.as_path(out)  # a local path or a URI (written as one upload)
    storage.make_dir(out.parent)
    if storage.is_remote(out):
        with out.open("wb") as f:
            fig.savefig(f, format="png")
    else:
        fig.savefig(out, format="png")
    plt.close(fig)
    return out
