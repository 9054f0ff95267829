"""``ipl-jax ablate``: the ablation table (docs/method.md §8, §11), IPL variants as settings switches.

The base job runs once in ``WORKDIR/base``; each variant of ``VARIANTS`` runs ``ablation.rounds`` round(s) from
the shared starting policy in ``WORKDIR/variants/<name>`` (equal settings share one run); results go to
``WORKDIR/ablation.json``. Resumes like ``ipl-jax run``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ipl_jax import distributed
from ipl_jax.eval.bootstrap import episode_counts, paired_gain_interval, read_predictions
from ipl_jax.pipeline import report
from ipl_jax.pipeline.run import run_job
from ipl_jax.pipeline.workdir import Workdir, write_json
from ipl_jax.sections import CommandLineText
from ipl_jax.settings import Settings

# name -> the settings it changes. continued_sft is the control (the same trees sampled and packed, the same
# number of updates spent on supervised training on the golden CoaT: do pairs add anything beyond more SFT?);
# no_evolution trains its own SFT and starting policy without the evolved Q&A (the one variant not from the shared
# starting policy);
# k2..k4 sample K per thinking turn; grpo / ppo / gigppo are the baselines' learners at T-DPO's budget of
# sampled completions per round (pipeline/rl_round.py).
VARIANTS = {
    "tdpo": {"ipl.method": "tdpo"},
    "continued_sft": {"ipl.method": "continued_sft"},
    "sft_oracle": {"ipl.method": "sft_oracle"},
    "naive_dpo": {"ipl.method": "naive_dpo"},
    "no_negatives": {"ipl.method": "no_negatives"},
    "no_evolution": {"evolution.enabled": False},
    "k2": {"sampler.tree.branching": (2, 2, 2, 1)},
    "k3": {"sampler.tree.branching": (3, 3, 3, 1)},
    "k4": {"sampler.tree.branching": (4, 4, 4, 1)},
    "grpo": {"ipl.method": "grpo"},
    "ppo": {"ipl.method": "ppo"},
    "gigppo": {"ipl.method": "gigppo"},
}
LABELS = {
    "start": "starting policy (no IPL)",
    "tdpo": "T-DPO (full)",
    "continued_sft": "continued SFT (control)",
    "sft_oracle": "oracle SFT (hidden CoaT)",
    "naive_dpo": "naive DPO",
    "no_negatives": "IPL w/o negatives",
    "no_evolution": "w/o instr. evolution",
    "k2": "K = 2",
    "k3": "K = 3",
    "k4": "K = 4",
    "grpo": "GRPO (UI-R1)",
    "ppo": "PPO (online, dense)",
    "gigppo": "GiGPPO (online)",
}
ROUND_SECTIONS = ("ipl", "rl")  # what a variant of your own may change: the rounds, never the shared stages before
SHARED_STAGES = ("data", "evolution", "model", "sft", "start", "eval_start")
SHARED_DIRS = ("data", "evolution", "model", "sft", "start", "eval/round_0")  # a variant's own rounds: its eval/


def variant_settings(base: Settings, name: str, variants=None) -> Settings:
    """The base settings with the variant's switches, ``ipl.rounds = ablation.rounds``, early stop off and every
    round evaluated on the test splits (the gain per round). ``variants``: name -> {"section.field": value}
    (default ``VARIANTS``)."""
    variants = VARIANTS if variants is None else variants
    if name not in variants:
        raise ValueError(f"unknown ablation variant {name!r}; known: {', '.join(variants)}")
    rounds = {"ipl.rounds": base.ablation.rounds, "ipl.early_stop": False, "eval.every_round": True}
    return base.replace({**variants[name], **rounds})


def parse_variant(text: str) -> tuple[str, dict]:
    """A variant of your own, ``"NAME=BASE FIELD=VALUE ..."`` (``ipl-jax ablate --variant``): ``BASE`` (optional)
    one of ``VARIANTS`` whose switches it starts from, then round settings (``ipl.*``, ``rl.*``) changed, each value
    parsed by its field's type when the settings are made. Returns (name, {"section.field": value}); a malformed
    text is a one-line ``ValueError``."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name.replace("_", "").isalnum() or not name.islower():
        raise ValueError(
            f"--variant {text!r}: expected NAME=[BASE] FIELD=VALUE ... with NAME in lower-case letters, digits, _"
        )
    if name in VARIANTS:
        raise ValueError(f"--variant {text!r}: {name!r} is a built-in variant; choose another name")
    switches: dict = {}
    for i, item in enumerate(rest.split()):
        field, eq, value = item.partition("=")
        if not eq and i == 0 and item in VARIANTS:
            switches.update(VARIANTS[item])
        elif not eq:
            raise ValueError(
                f"--variant {text!r}: {item!r} is neither a variant ({', '.join(VARIANTS)}) nor FIELD=VALUE"
            )
        elif field.split(".")[0] not in ROUND_SECTIONS:
            raise ValueError(
                f"--variant {text!r}: {field!r} is not a round setting (ipl.* or rl.*); the starting policy is shared "
                f"by every variant, so settings of the stages before the rounds go to --config for the whole ablation"
            )
        else:
            switches[field] = CommandLineText(value)
    if not switches:
        raise ValueError(f"--variant {text!r}: changes nothing (give a BASE variant or FIELD=VALUE)")
    return name, switches


def _ipl_key(settings: Settings) -> str:
    """What decides a variant's result: all of its settings (equal settings, one run)."""
    return json.dumps(settings.to_dict(), sort_keys=True)


def _share(base: Workdir, wd: Workdir, names: Sequence[str], stages: Sequence[str]) -> None:
    """Point ``wd`` at the base job's outputs (symlinks) and copy its stage markers (the main process)."""
    for d in names if wd.main else ():
        src, dst = base.existing(d), wd.path(d)  # (an older base or variant keeps the starting policy in seed/)
        if src.exists() and not wd.existing(d).exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(src, dst, target_is_directory=True)
    for stage in stages:
        if base.is_done(stage) and not wd.is_done(stage):
            wd.mark_done(stage, base.summary(stage))
    distributed.barrier(f"shared with {wd.root.name}")


def _episode_counts(wd_root: Path, round_dir: str, splits: Sequence[str]) -> list[dict]:
    return [episode_counts(read_predictions(wd_root / "eval" / round_dir / f"{s}.predictions.jsonl")) for s in splits]


def _mean_total(metrics: dict, splits: Sequence[str]) -> float:
    return float(sum(float(metrics[s]["total"]["exact_acc"] or 0.0) for s in splits) / len(splits))


def _start_row(base: Workdir, splits: Sequence[str]) -> dict:
    """The table's first row: the shared starting policy as evaluated by the base job (no pairs, no samples)."""
    base_eval = base.summary("eval_start")
    return {
        "variant": "start",
        "label": LABELS["start"],
        "metrics": base_eval["metrics"],
        "pairs": 0,
        "blank": base_eval.get("blank"),
        "trees": base.summary("start")["trees"],
        "seconds": 0.0,
        "mean_total": _mean_total(base_eval["metrics"], splits),
        "online": base_eval.get("online"),
        "online_splits": base_eval.get("online_splits"),
        "samples": 0,
    }


def _run_variant(vc: Settings, name: str, base: Workdir, root: Path, splits: Sequence[str], echo) -> tuple:
    """Run one variant's rounds in ``root/variants/<name>`` from the shared starting policy (no_evolution: from the
    shared data only). Returns (its row without gains, its episode counts per round and test split)."""
    wd = Workdir(root / "variants" / name, echo=echo)
    if name == "no_evolution":
        _share(base, wd, ("data",), ("data",))
    else:
        _share(base, wd, SHARED_DIRS, SHARED_STAGES)
    run_job(vc, wd.root, stop_after="rounds", echo=echo)
    last = max((int(p.name.split("_")[1].split(".")[0]) for p in wd.path("stages").glob("round_*.done")), default=0)
    summaries = [wd.summary(f"round_{r}") for r in range(1, last + 1)]
    final = summaries[-1]
    row = {
        "variant": name,
        "label": LABELS.get(name, name),
        "metrics": final["metrics"],
        "rounds": last,
        "blank": final.get("blank"),
        "pairs": sum(s["record"]["pairs"] for s in summaries),
        "pairs_by_turn": summaries[0]["record"].get("pairs_by_turn"),
        "pair_counts": summaries[0]["record"].get("pair_counts"),
        "updates": sum(int(s["record"]["train"].get("steps", 0)) for s in summaries),
        "trees": summaries[0]["record"]["classes"],
        "seconds": round(sum(s["seconds"] for s in summaries), 1),
        "mean_total": _mean_total(final["metrics"], splits),
        "method": vc.ipl.method,
        "online": final.get("online"),
        "online_splits": final.get("online_splits"),
        "samples": sum(int(s["record"].get("samples", 0)) for s in summaries),
        "budget": sum(int(s["record"].get("budget", 0)) for s in summaries),
        "diagnostics": [s["record"].get("diagnostics") for s in summaries],
    }
    counts = [_episode_counts(wd.root, f"round_{r}", splits) for r in range(1, last + 1)]
    if name == "no_evolution":  # its own starting policy: the gain is still measured against the shared one's table
        row["start_metrics"] = wd.summary("eval_start")["metrics"]
    return row, counts


def _add_tdpo_minus(rows: list[dict], counts: dict[str, list], seed: int) -> None:
    """T-DPO minus each other variant, paired on the same test episodes, round by round (in place, when T-DPO ran)."""
    if "tdpo" not in counts:
        return
    for row in rows[1:]:
        other = counts.get(row.get("same_as", row["variant"]))
        if row["variant"] != "tdpo" and other:
            pairs = zip(other, counts["tdpo"])
            row["tdpo_minus"] = [paired_gain_interval(o, t, seed=seed) for o, t in pairs]


def run_ablation(
    settings: Settings,
    workdir: str | Path,
    variants: Sequence[str],
    echo=print,
    extra_variants: dict | None = None,
) -> dict:
    """The base job once, then each variant's round(s) from its starting policy; ``extra_variants`` adds named
    variants."""
    known = {**VARIANTS, **(extra_variants or {})}
    splits = list(settings.data.test_splits)
    root = Path(workdir)
    echo("== base job (shared starting policy) ==")
    base = run_job(settings, root / "base", stop_after="eval_start", echo=echo)
    start_counts = _episode_counts(base.root, "round_0", splits)
    rows = [_start_row(base, splits)]
    done: dict[str, dict] = {}
    counts: dict[str, list] = {}  # variant -> per round, per test split: {episode: (exact, steps)}
    for name in variants:
        vc = variant_settings(settings, name, known)
        key = _ipl_key(vc)
        if key in done:
            echo(f"== {name}: same settings as {done[key]['variant']}; reusing its result ==")
            rows.append(
                {**done[key], "variant": name, "label": LABELS.get(name, name), "same_as": done[key]["variant"]}
            )
            continue
        echo(f"== variant {name} ==")
        row, counts[name] = _run_variant(vc, name, base, root, splits, echo)
        row["round_gains"] = [paired_gain_interval(start_counts, c, seed=settings.seed) for c in counts[name]]
        row["gain"] = row["round_gains"][-1]
        rows.append(row)
        done[key] = row
    _add_tdpo_minus(rows, counts, settings.seed)
    result = {
        "splits": list(settings.data.test_splits),
        "rounds": settings.ablation.rounds,
        "seed": settings.seed,
        "rows": rows,
    }
    if distributed.is_main():
        write_json(root / "ablation.json", result)
    return result


def run_seeds(
    settings: Settings,
    workdir: str | Path,
    variants: Sequence[str],
    seeds: Sequence[int],
    echo=print,
    extra_variants: dict | None = None,
) -> dict:
    """``run_ablation`` for each seed of ``seeds`` in ``WORKDIR/seed_<s>``, then ``summarize_seeds`` of them,
    written to ``WORKDIR/ablation_seeds.json``."""
    results = []
    for s in seeds:
        echo(f"==== seed {s} ====")
        seeded = settings.replace({"seed": int(s)})
        results.append(run_ablation(seeded, Path(workdir) / f"seed_{s}", variants, echo, extra_variants))
    summary = summarize_seeds(results)
    if distributed.is_main():
        write_json(Path(workdir) / "ablation_seeds.json", summary)
    return summary


def _mean_sd(values: Sequence[float]) -> dict:
    """``{"mean", "sd", "n"}``: the sample standard deviation (0 for one value)."""
    v = np.asarray(values, np.float64)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size)}


def summarize_seeds(results: Sequence[dict]) -> dict:
    """Per variant over the ablations of several seeds (``run_ablation``'s results, one per seed): each seed's gain
    over its starting policy with its interval, their mean ± sd after the last round and round by round, and T-DPO
    minus the variant (paired on the same test episodes) per seed, mean ± sd and the seeds where T-DPO is ahead."""
    if not results:
        raise ValueError("summarize_seeds: no ablation results")
    seeds = [int(r["seed"]) for r in results]
    out = []
    for first in results[0]["rows"][1:]:
        name = first["variant"]
        rows = [next(row for row in r["rows"] if row["variant"] == name) for r in results]
        n_rounds = min(len(row["round_gains"]) for row in rows)
        entry = {
            "variant": name,
            "label": first.get("label", name),
            "gains": [row["gain"] for row in rows],
            "gain": _mean_sd([row["gain"]["gain"] for row in rows]),
            "round_gain": [_mean_sd([row["round_gains"][k]["gain"] for row in rows]) for k in range(n_rounds)],
        }
        if all(row.get("tdpo_minus") for row in rows):
            last = [row["tdpo_minus"][-1] for row in rows]
            entry["tdpo_minus"] = last
            entry["tdpo_minus_mean"] = _mean_sd([d["gain"] for d in last])
            entry["tdpo_ahead"] = sum(d["gain"] > 0 for d in last)
        out.append(entry)
    return {
        "seeds": seeds,
        "splits": list(results[0]["splits"]),
        "rounds": results[0]["rounds"],
        "start_total": _mean_sd([r["rows"][0]["mean_total"] for r in results]),  # row 0: the starting policy
        "variants": out,
    }


def format_seeds(summary: dict) -> str:
    """The table over seeds (``summarize_seeds``): gains per seed and per round, T-DPO minus each variant."""
    seeds = ", ".join(str(s) for s in summary["seeds"])
    st = summary["start_total"] if "start_total" in summary else summary["seed_total"]  # (older: seed_total)
    return "\n\n".join(
        [
            f"gain over the starting policy (points of mean total match over {', '.join(summary['splits'])}) after "
            f"{summary['rounds']} round(s), mean ± sd over seeds {seeds} (starting policy {100 * st['mean']:.1f} ± "
            f"{100 * st['sd']:.1f}); per seed with its 95 % paired bootstrap interval over test episodes\n"
            + report.seeds_gain_table(summary["variants"], summary["seeds"], "gains", "gain"),
            "gain after each round, mean ± sd over the seeds\n" + report.round_curve_table(summary["variants"]),
            "T-DPO minus the variant after the last round, paired on the same test episodes: mean ± sd, seeds where "
            "T-DPO is ahead, per seed with its 95 % interval\n"
            + report.seeds_gain_table(
                [v for v in summary["variants"] if "tdpo_minus" in v], summary["seeds"], "tdpo_minus", "tdpo_minus_mean"
            ),
        ]
    )


def format_ablation(result: dict) -> str:
    blocks = []
    rows = [{**r, "variant": r.get("label", r["variant"])} for r in result["rows"]]
    for split in result["splits"]:
        blocks.append(
            f"step accuracy (%) on {split}, after {result['rounds']} IPL round(s)\n"
            + report.ablation_table(rows, split)
        )
    blocks.append(
        f"summary over the test splits ({', '.join(result['splits'])}); gain = mean total match minus the "
        f"starting policy's, 95 % paired bootstrap over test episodes\n" + report.ablation_summary(rows)
    )
    blocks.append(
        "online (greedy episodes on held-out tasks in the live world), samples used / budget of the round(s) "
        "(completions; environment steps for PPO), updates, wall time\n" + report.online_budget_table(rows)
    )
    blocks.append(
        "gain after each round [95 % paired interval]; T-DPO minus the variant after each round, paired on the "
        "same test episodes\n" + report.round_gains_table(rows)
    )
    if any(any(r.get("diagnostics") or ()) for r in rows):
        blocks.append(
            "what each round did, before->after its update: preference accuracy (% of pairs with log p(chosen) > "
            "log p(rejected)), log-prob margin and implicit reward margin on its pairs and on held-out pairs; "
            "sampled pass@1, greedy accuracy and thought->action consistency (%) on its steps\n"
            + report.diagnostics_table(rows)
        )
    return "\n\n".join(blocks)
