"""What the job hands over: the round it exports (``choose_round``: the best dev step accuracy), that round's scores
against the starting policy's (``results.json["exported"]``, ``exported_block``) and the lines the run ends with
(``export_report``). Pure functions of ``results.json``'s round entries; ``run.Job`` evaluates the chosen round
on the test splits and in the live world first when no stage did (``is_evaluated``).
"""

from __future__ import annotations

from collections.abc import Sequence

RULE = "best dev step accuracy (ties: the later round)"
# the keys of a round entry that a test-split / live-world evaluation fills (eval_stage.evaluate_policy_splits)
EVAL_KEYS = ("metrics", "reading", "blank", "blank_reading", "online", "online_splits")
SMALL_DEV = 50  # dev episodes below which the printout warns that dev picks rounds by noise as much as by skill


def choose_round(rounds: Sequence[dict]) -> int:
    """The round to export: the highest ``dev.step_accuracy``, the later round on a tie (round 0 = the starting
    policy)."""
    if not rounds:
        raise ValueError("choose_round: no evaluated round to export (results.json has no rounds)")
    return int(max(rounds, key=lambda r: (float(r["dev"]["step_accuracy"]), int(r["round"])))["round"])


def is_evaluated(entry: dict) -> bool:
    """Whether a round entry holds its test-split evaluation (an intermediate round of ``eval.every_round = False``
    has dev accuracy only: ``metrics`` is empty)."""
    return bool(entry.get("metrics"))


def _mean(values: Sequence[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def policy_scores(entry: dict, test_names: Sequence[str]) -> dict:
    """One policy's headline scores from its round entry: ``step_accuracy`` {split: Step.Acc}, their mean
    ``step_accuracy_mean``, ``blank_step_accuracy`` {split: Step.Acc with grey screenshots}, ``online_success``
    {live-world split: success rate} and ``reading`` {split: page / texts / grounding}; None where not evaluated."""
    metrics = entry.get("metrics") or {}
    accs = {s: (metrics.get(s) or {}).get("step_acc") for s in test_names}
    return {
        "step_accuracy_mean": _mean(list(accs.values())),
        "step_accuracy": accs,
        "blank_step_accuracy": {s: t.get("step_acc") for s, t in (entry.get("blank") or {}).items()},
        "online_success": {s: o.get("success_rate") for s, o in (entry.get("online_splits") or {}).items()},
        "reading": entry.get("reading") or {},
    }


def exported_block(
    rounds: Sequence[dict], chosen: int, evaluated_at_export: bool, test_names: Sequence[str], dev: dict
) -> dict:
    """``results.json["exported"]``: ``round`` (0 = the starting policy), the ``rule`` that chose it, ``dev``
    (``episodes``, ``steps`` and each round's ``step_accuracy`` as [round, accuracy]), ``evaluated_at_export`` (its
    test and live-world scores were measured for the export, no round stage having done so), ``scores`` and
    ``start_scores`` (``policy_scores``; ``seed_scores`` in older results) and ``gain`` (exported minus the starting
    policy, mean step accuracy; None if either is missing)."""
    entry = next(r for r in rounds if int(r["round"]) == chosen)
    scores, start = policy_scores(entry, test_names), policy_scores(rounds[0], test_names)
    a, b = scores["step_accuracy_mean"], start["step_accuracy_mean"]
    return {
        "round": int(chosen),
        "rule": RULE,
        "dev": {**dev, "step_accuracy": [[int(r["round"]), float(r["dev"]["step_accuracy"])] for r in rounds]},
        "evaluated_at_export": bool(evaluated_at_export),
        "scores": scores,
        "start_scores": start,
        "gain": None if a is None or b is None else a - b,
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _row(name: str, a: float | None, b: float | None) -> str:
    diff = "" if a is None or b is None else f"{100 * (b - a):+8.1f}"
    return f"  {name:<28}{_pct(a):>8}{_pct(b):>9}{diff}"


def export_report(exported: dict) -> str:
    """The lines the job ends with: which round it exported and why (the rule, every round's dev accuracy, a
    warning when dev is small), then the exported policy's scores against the starting policy's (%; last column the
    gain). An older ``exported`` block (``seed_scores``) reads the same."""
    r, dev = exported["round"], exported["dev"]
    name = "the starting policy" if r == 0 else f"round {r}"
    devs = ", ".join(
        f"{'start' if k == 0 else 'round ' + str(k)} {100 * v:.1f}%{' <-' if k == r else ''}"
        for k, v in dev["step_accuracy"]
    )
    lines = [
        f"exported: {name} (WORKDIR/export), by the {exported['rule']} on {dev['episodes']} dev episodes "
        f"({dev['steps']} steps): {devs}",
    ]
    if dev["episodes"] < SMALL_DEV:
        lines.append(
            f"  dev holds {dev['episodes']} episodes: differences of a few points between rounds there are mostly "
            f"noise,\n  so the exported round may not be the best one on the test splits (docs/rounds.md)"
        )
    how = "evaluated for the export" if exported["evaluated_at_export"] else "its evaluation when it ran"
    s = exported["scores"]
    start = exported["start_scores"] if "start_scores" in exported else exported["seed_scores"]
    lines.append(f"  scores in % ({how}):")
    lines.append(f"  {'':<28}{'start':>8}{name if r else 'start':>9}{'gain':>8}")
    lines.append(_row("test splits, mean", start["step_accuracy_mean"], s["step_accuracy_mean"]))
    for split in s["step_accuracy"]:
        lines.append(_row(split, start["step_accuracy"].get(split), s["step_accuracy"].get(split)))
    for split in s["blank_step_accuracy"]:
        lines.append(
            _row(f"{split}, grey screens", start["blank_step_accuracy"].get(split), s["blank_step_accuracy"][split])
        )
    for split in s["online_success"]:
        lines.append(_row(f"live world {split}", start["online_success"].get(split), s["online_success"][split]))
    for split, reading in list(s["reading"].items())[:1]:  # the others: the round table
        for key in ("page", "texts", "grounding"):
            lines.append(_row(f"{key} ({split})", (start["reading"].get(split) or {}).get(key), reading.get(key)))
    return "\n".join(lines)
