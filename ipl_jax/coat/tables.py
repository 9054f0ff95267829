"""The Step.Acc metric tables of each benchmark (docs/method.md §8) from ``coat.metrics`` verdicts: per golden type
and ``total`` the ``count``, ``type_acc``, ``exact_acc``, plus episode-level rates and per-subsplit / per-app
tables where the benchmark has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ipl_jax.coat.actions import CORE_TYPES, Action
from ipl_jax.coat.metrics import (
    DEFAULT_RULES,
    FORMATS,
    EpisodeLike,
    MatchRules,
    StepLike,
    Verdict,
    get_rules,
    match_step,
)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One scored step: its golden type, whether the prediction parsed, the verdict, and grouping keys."""

    episode_id: str
    step_id: int
    gold_type: str
    parsed: bool
    verdict: Verdict
    subsplits: tuple[str, ...] = ()
    app: str | None = None


def _frac(num: int, den: int) -> float | None:
    return num / den if den else None


def type_row(results: Sequence[StepResult]) -> dict:
    """``{"count", "type_acc", "exact_acc"}`` of a group of step results (fractions; None when empty)."""
    n = len(results)
    return {
        "count": n,
        "type_acc": _frac(sum(r.verdict.type_match for r in results), n),
        "exact_acc": _frac(sum(r.verdict.exact_match for r in results), n),
    }


def grounding_acc(results: Sequence[StepResult]) -> float | None:
    """AndroidControl grounding: golden-click exact matches ÷ golden-click type matches (None if none)."""
    clicks = [r for r in results if r.gold_type == "click" and r.verdict.type_match]
    return _frac(sum(r.verdict.exact_match for r in clicks), len(clicks))


def split_row(results: Sequence[StepResult], with_grounding: bool = False) -> dict:
    """A per-subsplit / per-app row: ``count``, ``type_acc``, ``step_acc`` (+ ``grounding``)."""
    row = type_row(results)
    out = {"count": row["count"], "type_acc": row["type_acc"], "step_acc": row["exact_acc"]}
    if with_grounding:
        out["grounding"] = grounding_acc(results)
    return out


def step_acc_table(results: Sequence[StepResult], fmt: str = "aitz") -> dict:
    """The metric table of ``fmt`` from scored steps (episodes: results sharing an ``episode_id``, by ``step_id``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    results = list(results)
    by_type: dict[str, list[StepResult]] = {t.upper(): [] for t in CORE_TYPES}
    for r in results:
        by_type.setdefault(r.gold_type.upper(), []).append(r)
    table: dict = {"total": type_row(results)}
    for name, rows in by_type.items():
        table[name] = type_row(rows)

    episodes: dict[str, list[StepResult]] = {}
    for r in results:
        episodes.setdefault(r.episode_id, []).append(r)
    success, progress = [], []
    for rows in episodes.values():
        rows = sorted(rows, key=lambda r: r.step_id)
        exact = [r.verdict.exact_match for r in rows]
        first_miss = exact.index(False) if False in exact else len(exact)
        success.append(first_miss == len(exact))
        progress.append(first_miss / len(exact))
    table["parse_rate"] = _frac(sum(r.parsed for r in results), len(results))
    table["episode_success"] = _frac(sum(success), len(success))
    table["goal_progress"] = sum(progress) / len(progress) if progress else None
    table["steps"] = len(results)
    table["episodes"] = len(episodes)
    table["step_acc"] = table["total"]["exact_acc"]

    if fmt == "androidcontrol":
        table["grounding"] = grounding_acc(results)
        groups: dict[str, list[StepResult]] = {}
        for r in results:
            for s in r.subsplits:
                groups.setdefault(s, []).append(r)
        table["subsplits"] = {s: split_row(rows, with_grounding=True) for s, rows in sorted(groups.items())}
    elif fmt == "amex":
        groups = {}
        for r in results:
            if r.app is not None:
                groups.setdefault(r.app, []).append(r)
        table["apps"] = {a: split_row(rows) for a, rows in sorted(groups.items())}
    return table


def _meta(step: StepLike, episode: EpisodeLike, key: str):
    v = step.meta.get(key)
    return episode.meta.get(key) if v is None else v


def score_steps(
    episodes: Sequence[EpisodeLike],
    predictions: Mapping[tuple[str, int], Action],
    rules: str | MatchRules = "aitz",
) -> list[StepResult]:
    """Judge every step of ``episodes`` against ``predictions[(episode_id, step_id)]`` (a missing key is a miss)."""
    rules = get_rules(rules)
    out = []
    for ep in episodes:
        for step in ep.steps:
            pred = predictions.get((str(step.episode_id), int(step.step_id)))
            subsplits = _meta(step, ep, "subsplits") or ()
            if isinstance(subsplits, str):
                subsplits = (subsplits,)
            out.append(
                StepResult(
                    episode_id=str(step.episode_id),
                    step_id=int(step.step_id),
                    gold_type=step.action.type,
                    parsed=bool(isinstance(pred, Action) and pred.parsed),
                    verdict=match_step(pred, step, rules),
                    subsplits=tuple(str(s) for s in subsplits),
                    app=_meta(step, ep, "app"),
                )
            )
    return out


def score_episodes(
    episodes: Sequence[EpisodeLike],
    predictions: Mapping[tuple[str, int], Action],
    fmt: str = "aitz",
    rules: str | MatchRules | None = None,
) -> dict:
    """The metric table of ``fmt`` for predictions keyed by ``(episode_id, step_id)``, naming its ``"rules"``
    (default the format's) and ``"format"``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    rule_set = get_rules(DEFAULT_RULES[fmt] if rules is None else rules)
    table = step_acc_table(score_steps(episodes, predictions, rule_set), fmt)
    table["format"] = fmt
    table["rules"] = rule_set.name
    return table


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100.0 * v:6.2f}"


def format_table(table: dict) -> str:
    """A plain-text rendering of a ``score_episodes`` table (percentages)."""
    lines = [
        f"format {table.get('format', '?')}, rules {table.get('rules', '?')}: "
        f"{table['steps']} steps in {table['episodes']} episodes",
        "",
    ]
    lines.append(f"{'':<12}{'count':>8}{'type %':>10}{'exact %':>10}")
    type_names = [k for k, v in table.items() if isinstance(v, dict) and "exact_acc" in v and k != "total"]
    for name in type_names + ["total"]:
        row = table[name]
        lines.append(f"{name:<12}{row['count']:>8}{_pct(row['type_acc']):>10}{_pct(row['exact_acc']):>10}")
    lines.append("")
    for key in ("parse_rate", "episode_success", "goal_progress", "grounding"):
        if key in table:
            lines.append(f"{key:<16}{_pct(table[key]):>8} %")
    for group in ("subsplits", "apps"):
        if table.get(group):
            lines.append("")
            cols = ["count", "type_acc", "step_acc"] + (["grounding"] if group == "subsplits" else [])
            lines.append(f"{group[:-1]:<20}" + "".join(f"{c:>11}" for c in cols))
            for name, row in table[group].items():
                cells = [f"{row['count']:>11}"] + [f"{_pct(row[c]):>11}" for c in cols[1:]]
                lines.append(f"{name:<20}" + "".join(cells))
    return "\n".join(lines)
