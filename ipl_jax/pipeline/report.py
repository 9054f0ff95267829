"""The job's reports: ``results.json``, the per-round tables (like the paper's), and the ablation table."""

from __future__ import annotations

from collections.abc import Sequence

from ipl_jax.viz.plots import TYPE_ROWS


def results_round(round_index: int, metrics: dict, trees: dict, pairs: int, seconds: float, **extra) -> dict:
    """One entry of ``results.json["rounds"]``."""
    return {
        "round": int(round_index),
        "metrics": metrics,
        "trees": {k: float(trees.get(k, 0.0)) for k in ("alpha", "beta", "gamma")},
        "pairs": int(pairs),
        "seconds": round(float(seconds), 2),
        **extra,
    }


def _pct(v: float | None) -> str:
    return "   -  " if v is None else f"{100.0 * v:6.2f}"


def _ci(summary: dict | None) -> str:
    """A live-world success rate's 95% interval as a 10-wide cell, ``lo-hi`` in %."""
    ci = (summary or {}).get("success_ci95")
    return f"{'-':>10}" if not ci else f"{f'{100 * ci[0]:.0f}-{100 * ci[1]:.0f}':>10}"


def data_line(use: dict) -> str:
    """One line: the episodes warm-up SFT and the rounds used, of which kind (``Job.data_use``)."""
    sft, rounds, evo = use["warmup_sft"], use["rounds"], use["evolution"]
    return (
        f"episodes: warm-up SFT {sft['episodes']} {sft['kind']} ({sft['steps']} steps), rounds {rounds['episodes']} "
        f"{rounds['kind']} ({rounds['steps']} steps); evolution {evo['items']} Q&A on {evo['screens']} screens"
    )


def round_table(rounds: Sequence[dict], split: str) -> str:
    """Step accuracy (%) by action type, one column per round, then α/β/γ shares, pairs (samples, online success)."""
    head = f"{split:<18}" + "".join(f"{'start' if r['round'] == 0 else 'round ' + str(r['round']):>10}" for r in rounds)
    lines = [head, "-" * len(head)]
    for row in TYPE_ROWS + ("total",):
        cells = []
        for r in rounds:
            t = r["metrics"].get(split) or {}
            cells.append(f"{_pct((t.get(row) or {}).get('exact_acc')):>10}")
        lines.append(f"{row.lower() + ' match':<18}" + "".join(cells))
    cells = [f"{_pct((r['metrics'].get(split) or {}).get('total', {}).get('type_acc')):>10}" for r in rounds]
    lines.append(f"{'total type':<18}" + "".join(cells))
    lines.extend(reading_rows(rounds, split))
    for key, name in (("alpha", "alpha trees"), ("beta", "beta trees"), ("gamma", "gamma trees")):
        lines.append(f"{name:<18}" + "".join(f"{_pct(r['trees'].get(key)):>10}" for r in rounds))
    lines.append(f"{'pairs':<18}" + "".join(f"{r['pairs']:>10}" for r in rounds))
    lines.append(f"{'seconds':<18}" + "".join(f"{r['seconds']:>10.0f}" for r in rounds))
    if any("samples" in r for r in rounds):  # completions (environment steps for PPO) the round sampled
        lines.append(f"{'samples':<18}" + "".join(f"{r.get('samples', 0):>10}" for r in rounds))
    online_splits = list(dict.fromkeys(s for r in rounds for s in (r.get("online_splits") or {})))
    if online_splits:  # success rate per live-world split (seen tasks, unseen tasks)
        for name in online_splits:
            cells = [
                f"{_pct(((r.get('online_splits') or {}).get(name) or {}).get('success_rate')):>10}" for r in rounds
            ]
            lines.append(f"{'online ' + name:<18.18}" + "".join(cells))
            lines.append(
                f"{'  95% interval':<18}" + "".join(_ci((r.get("online_splits") or {}).get(name)) for r in rounds)
            )
    elif any(r.get("online") for r in rounds):
        cells = [f"{_pct((r.get('online') or {}).get('success_rate')):>10}" for r in rounds]
        lines.append(f"{'online success':<18}" + "".join(cells))
        lines.append(f"{'  95% interval':<18}" + "".join(_ci(r.get("online")) for r in rounds))
    if any(r.get("diagnostics") for r in rounds):
        for name, section, key in DIAGNOSTIC_ROWS:
            if key == "logp_margin":  # "before->after" log-prob margins need more than a column: the ablation has them
                continue
            cells = [f"{diagnostic_cell(r.get('diagnostics'), section, key):>10}" for r in rounds]
            lines.append(f"{name:<18}" + "".join(cells))
    return "\n".join(lines)


READING_ROWS = (("page named", "page"), ("texts read", "texts"), ("grounding", "grounding"))


def reading_rows(rounds: Sequence[dict], split: str) -> list[str]:
    """Rows of the round table: the reading scores of ``split`` (``eval.reading``: page named, texts read,
    grounding; %), then with grey screenshots where evaluated (``grey total`` = Step.Acc); "-" where absent."""
    lines = []
    for section, prefix in (("reading", ""), ("blank_reading", "grey ")):
        if not any(split in (r.get(section) or {}) for r in rounds):
            continue
        if section == "blank_reading":
            cells = [
                _pct((((r.get("blank") or {}).get(split) or {}).get("total") or {}).get("exact_acc")) for r in rounds
            ]
            lines.append(f"{'grey total match':<18}" + "".join(f"{c:>10}" for c in cells))
        for name, key in READING_ROWS:
            cells = [_pct(((r.get(section) or {}).get(split) or {}).get(key)) for r in rounds]
            lines.append(f"{prefix + name:<18}" + "".join(f"{c:>10}" for c in cells))
    return lines


# The round diagnostics as table rows: (row name, section of ``diagnostics``, figure). A figure measured before and
# after the update prints as "before->after" (shares in %), the implicit reward margin (after only) as a number.
DIAGNOSTIC_ROWS = (
    ("train pairs acc", "train_pairs", "accuracy"),
    ("train logp margin", "train_pairs", "logp_margin"),
    ("train rew margin", "train_pairs", "reward_margin"),
    ("held-out acc", "heldout_pairs", "accuracy"),
    ("held-out logp m.", "heldout_pairs", "logp_margin"),
    ("held-out rew m.", "heldout_pairs", "reward_margin"),
    ("pass@1 (train)", "train_steps", "pass_at_1"),
    ("greedy (train)", "train_steps", "greedy"),
    ("consistency", "train_steps", "consistency"),
)
# their column heads in the ablation's table (one line per variant and round)
_SHORT = ("pairs acc", "logp margin", "reward m.", "h/o acc", "h/o logp m", "h/o reward", "pass@1", "greedy", "consist")
_SHARES = ("accuracy", "pass_at_1", "greedy", "consistency", "thought_names_golden", "reward_accuracy")


def diagnostic_cell(diagnostics: dict | None, section: str, key: str) -> str:
    """One figure of a round's ``diagnostics``: "b->a" for a before / after pair ("-" where absent)."""
    d = (diagnostics or {}).get(section) or {}

    def fmt(v) -> str:
        if v is None:
            return "-"
        return f"{100 * v:.0f}" if key in _SHARES else f"{v:+.2f}"

    before, after = d.get(f"{key}_before"), d.get(f"{key}_after")
    if before is not None or after is not None:
        return f"{fmt(before)}->{fmt(after)}"
    return fmt(d.get(key))


def diagnostics_table(rows: Sequence[dict]) -> str:
    """One line per (variant, round) of the ablation: ``DIAGNOSTIC_ROWS`` before->after the update."""
    head = f"{'variant':<26}{'round':>6}" + "".join(f" {name:>15}" for name in _SHORT)
    lines = [head, "-" * len(head)]
    for r in rows:
        for i, d in enumerate(r.get("diagnostics") or ()):
            cells = "".join(f" {diagnostic_cell(d, section, key):>15}" for _, section, key in DIAGNOSTIC_ROWS)
            lines.append(f"{r['variant']:<26}{i + 1:>6}" + cells)
    return "\n".join(lines)


def ablation_table(rows: Sequence[dict], split: str) -> str:
    """Rows = variants; columns = per-type step accuracy (%) and total, then pairs of the round(s)."""
    cols = [c.lower() for c in TYPE_ROWS] + ["total"]
    head = f"{'variant':<26}" + "".join(f"{c:>9}" for c in cols) + f"{'pairs':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        t = (r.get("metrics") or {}).get(split) or {}
        cells = [f"{_pct((t.get(c.upper() if c != 'total' else 'total') or {}).get('exact_acc')):>9}" for c in cols]
        lines.append(f"{r['variant']:<26}" + "".join(cells) + f"{r.get('pairs', 0):>9}")
    return "\n".join(lines)


def ablation_summary(rows: Sequence[dict]) -> str:
    """One line per variant: mean match, gain [95 % interval], blank-screen match, α/β/γ, updates, pairs."""
    head = (
        f"{'variant':<26}{'total':>7}{'gain [95% CI]':>22}{'blank':>7}{'α/β/γ %':>14}{'updates':>8}"
        f"{'pairs β/γ':>11}  pairs by turn"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        gain = _interval(r.get("gain"))
        blank = r.get("blank") or {}
        b = [float((t.get("total") or {}).get("exact_acc") or 0.0) for t in blank.values()]
        trees = r.get("trees") or {}
        shares = "/".join(f"{100 * float(trees.get(k, 0.0)):.0f}" for k in ("alpha", "beta", "gamma"))
        pc = (r.get("pair_counts") or {}).get("by_class") or {}
        by_turn = r.get("pairs_by_turn") or []
        lines.append(
            f"{r['variant']:<26}{_pct(r.get('mean_total')):>7}{gain:>22}"
            f"{_pct(sum(b) / len(b) if b else None):>7}{shares:>14}{r.get('updates', 0):>8}"
            f"{str(pc.get('beta', 0)) + '/' + str(pc.get('gamma', 0)):>11}  "
            f"{'/'.join(str(x) for x in by_turn[1:]) if by_turn else '-'}"
        )
    return "\n".join(lines)


def _interval(g: dict | None) -> str:
    """``+2.5 [-1.0, +6.0]`` (points) of a ``paired_gain_interval`` result; empty for none."""
    return "" if not g else f"{100 * g['gain']:+.1f} [{100 * g['low']:+.1f}, {100 * g['high']:+.1f}]"


def _mean_sd(m: dict | None) -> str:
    return "" if not m else f"{100 * m['mean']:+.1f} ± {100 * m['sd']:.1f}"


def round_gains_table(rows: Sequence[dict]) -> str:
    """One line per variant (the starting policy's row left out): gain after each round, T-DPO minus it after each
    round."""
    lines = []
    for r in rows:
        if not r.get("round_gains"):
            continue
        gains = "  ".join(f"r{k + 1} {_interval(g)}" for k, g in enumerate(r["round_gains"]))
        minus = "  ".join(f"r{k + 1} {_interval(g)}" for k, g in enumerate(r.get("tdpo_minus") or ()))
        lines.append(f"{r['variant']:<26}gain {gains}" + (f"\n{'':<26}T-DPO minus {minus}" if minus else ""))
    return "\n".join(lines)


def seeds_gain_table(variants: Sequence[dict], seeds: Sequence[int], per_seed: str, mean: str) -> str:
    """One line per variant: ``mean`` (mean ± sd, points), then each seed's ``per_seed`` interval."""
    ahead = per_seed == "tdpo_minus"  # the seeds where T-DPO is ahead, k/n
    head = f"{'variant':<26}{'mean ± sd':>13}{'ahead' if ahead else '':>7}" + "".join(
        f"{'seed ' + str(s):>22}" for s in seeds
    )
    lines = [head, "-" * len(head)]
    for v in variants:
        k = f"{v['tdpo_ahead']}/{len(seeds)}" if ahead else ""
        lines.append(
            f"{v.get('label', v['variant']):<26}{_mean_sd(v.get(mean)):>13}{k:>7}"
            + "".join(f"{_interval(g):>22}" for g in v.get(per_seed) or ())
        )
    return "\n".join(lines)


def round_curve_table(variants: Sequence[dict]) -> str:
    """One line per variant: the mean ± sd gain over seeds after round 1, 2, ..."""
    n = max((len(v.get("round_gain") or ()) for v in variants), default=0)
    head = f"{'variant':<26}" + "".join(f"{'round ' + str(k + 1):>15}" for k in range(n))
    lines = [head, "-" * len(head)]
    for v in variants:
        lines.append(f"{v.get('label', v['variant']):<26}" + "".join(f"{_mean_sd(m):>15}" for m in v["round_gain"]))
    return "\n".join(lines)


def online_budget_table(rows: Sequence[dict]) -> str:
    """One line per variant: online success (%), mean live steps, samples / budget, updates, wall time (s)."""
    head = f"{'variant':<26}{'online %':>9}{'steps':>7}{'samples':>9}{'budget':>8}{'updates':>8}{'seconds':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        on = r.get("online") or {}
        steps = on.get("mean_steps")
        lines.append(
            f"{r['variant']:<26}{_pct(on.get('success_rate')):>9}{'-' if steps is None else f'{steps:.2f}':>7}"
            f"{r.get('samples', 0):>9}{r.get('budget') or '-':>8}{r.get('updates', 0):>8}"
            f"{float(r.get('seconds') or 0.0):>9.0f}"
        )
    return "\n".join(lines)


def _rate(tokens, seconds) -> float | None:
    return round(float(tokens) / float(seconds), 1) if tokens and seconds else None


def job_report(stage_log: Sequence[dict], sft: dict | None, rounds: Sequence[dict], device: str) -> dict:
    """``job_report.json``: per stage its seconds and device memory peak (last run of each), SFT and T-DPO
    ``tokens_per_s`` (compile included) and ``tokens_per_s_steady``, ``peak_device_bytes`` (None if uncounted)."""
    finished: dict[str, dict] = {}
    for e in stage_log:
        if e.get("event") == "finished":
            finished[e["stage"]] = e
    order = list(dict.fromkeys(e["stage"] for e in stage_log if e.get("event") == "started"))
    stages = [
        {
            "stage": s,
            "seconds": round(float(finished[s]["seconds"]), 2),
            "peak_device_bytes": finished[s].get("peak_device_bytes"),
        }
        for s in order
        if s in finished
    ]
    peaks = [s["peak_device_bytes"] for s in stages if s["peak_device_bytes"] is not None]
    out: dict = {
        "device": device,
        "stages": stages,
        "seconds": round(sum(s["seconds"] for s in stages), 2),
        "peak_device_bytes": max(peaks) if peaks else None,
    }
    if sft:
        out["sft"] = {
            "steps": sft.get("steps"),
            "tokens": sft.get("tokens"),
            "first_step_seconds": sft.get("first_step_seconds"),
            "tokens_per_s": sft.get("tokens_per_s"),
            "tokens_per_s_steady": sft.get("tokens_per_s_steady"),
        }
    out["tdpo"] = []
    for rec in rounds:
        train = rec.get("train") or {}
        if "tokens" not in train:  # continued SFT, GRPO, PPO: no T-DPO updates
            continue
        steady = _rate(train["tokens"] - train["first_step_tokens"], train["seconds"] - train["first_step_seconds"])
        out["tdpo"].append(
            {
                "round": rec["round"],
                "steps": train.get("steps"),
                "tokens": train["tokens"],
                "first_step_seconds": round(train["first_step_seconds"], 3),
                "tokens_per_s": _rate(train["tokens"], train["seconds"]),
                "tokens_per_s_steady": steady if train.get("steps", 0) > 1 else None,
                "phase_seconds": {k: round(float(v), 2) for k, v in (rec.get("seconds") or {}).items()},
            }
        )
    return out


def _gb(n) -> str:
    return "-" if n is None else f"{n / 1e9:.1f} GB"


def stage_table(report: dict) -> str:
    """The job report as text: one line per stage (seconds, device memory peak so far), then throughput."""
    lines = [f"{'stage':<14}{'seconds':>9}{'peak memory':>14}", "-" * 37]
    for s in report["stages"]:
        lines.append(f"{s['stage']:<14}{s['seconds']:>9.1f}{_gb(s['peak_device_bytes']):>14}")
    lines.append(f"{'total':<14}{report['seconds']:>9.1f}{_gb(report['peak_device_bytes']):>14}  ({report['device']})")

    def rate(name: str, r: dict) -> str:
        steady = r.get("tokens_per_s_steady")
        after = f", {steady:,.0f} after the first step" if steady else ""
        first = r.get("first_step_seconds")
        return (
            f"{name}: {r.get('steps')} steps, {r.get('tokens') or 0:,.0f} tokens, "
            f"{r.get('tokens_per_s') or 0:,.0f} tokens/s{after} (first step {first if first is not None else '-'} s)"
        )

    if report.get("sft"):
        lines.append(rate("SFT", report["sft"]))
    for r in report.get("tdpo", []):
        lines.append(rate(f"T-DPO round {r['round']}", r))
    return "\n".join(lines)
