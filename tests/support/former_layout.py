"""A workdir as the job wrote it before the starting policy had its own word: ``to_former_layout`` renames a new
workdir's starting-policy names back (stage markers, the policy directory, the stage log, config.json, results.json)."""

from __future__ import annotations

import json
from pathlib import Path

FORMER_STAGES = {"start": "seed", "eval_start": "eval_seed"}


def former_config(config: dict) -> dict:
    """A recorded config.json with the former names (``seed_selection``, ``sft.seed_candidates``)."""
    out = {("seed_selection" if k == "start_selection" else k): v for k, v in config.items()}
    out["sft"] = {("seed_candidates" if k == "start_candidates" else k): v for k, v in out["sft"].items()}
    return out


def to_former_layout(workdir: Path) -> None:
    """Rename ``workdir``'s starting-policy names to the former ones, in place."""
    stages = workdir / "stages"
    for new, old in FORMER_STAGES.items():
        if (stages / f"{new}.done").is_file():
            (stages / f"{new}.done").rename(stages / f"{old}.done")
    if (workdir / "start").exists() or (workdir / "start").is_symlink():
        (workdir / "start").rename(workdir / "seed")
    log = workdir / "stage_log.jsonl"
    if log.is_file():
        records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        records = [{**r, "stage": FORMER_STAGES.get(r["stage"], r["stage"])} for r in records]
        log.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = workdir / "config.json"
    if config.is_file():
        config.write_text(json.dumps(former_config(json.loads(config.read_text())), indent=1))
    results = workdir / "results.json"
    if results.is_file():
        res = json.loads(results.read_text())
        if "exported" in res:
            res["exported"] = {("seed_scores" if k == "start_scores" else k): v for k, v in res["exported"].items()}
        results.write_text(json.dumps(res, indent=1))
