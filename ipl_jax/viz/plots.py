"""Plots of a job's results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TYPE_ROWS = ("CLICK", "TYPE", "SCROLL", "PRESS", "STOP")


def type_accuracy_series(rounds: Sequence[dict], split: str) -> dict[str, list]:
    """{row: [exact accuracy or None per round]} for the action types and ``total`` of ``split``."""
    out: dict[str, list] = {}
    for row in TYPE_ROWS + ("total",):
        out[row] = [((r["metrics"].get(split) or {}).get(row) or {}).get("exact_acc") for r in rounds]
    return out


def plot_step_accuracy(rounds: Sequence[dict], split: str, out: str | Path, title: str | None = None) -> Path:
    """A PNG of step accuracy (%) per action type and in total across rounds (round 0 = the seed policy)."""
    import matplotlib  # a second to import: only the export stage draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [int(r["round"]) for r in rounds]
    series = type_accuracy_series(rounds, split)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for row, values in series.items():
        pts = [(x, 100.0 * v) for x, v in zip(xs, values) if v is not None]
        if not pts:
            continue
        style = dict(linewidth=2.6, color="black", marker="o") if row == "total" else dict(linewidth=1.4, marker=".")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=row.lower(), **style)
    ax.set_xlabel("IPL round (0 = seed policy)")
    ax.set_ylabel("step accuracy (%)")
    ax.set_xticks(xs)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title or f"Step accuracy by action type ({split})")
    ax.legend(loc="best", fontsize=8, ncol=2)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
