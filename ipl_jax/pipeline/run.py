"""The main job (``ipl-jax run``): data -> evolution -> model -> buckets -> warm-up SFT -> the starting policy's
selection and evaluation -> IPL rounds -> export (docs/method.md §1). Each stage runs through
``Workdir.run_stage``, so a rerun resumes (a workdir made before the rename reads as ``workdir.FORMER_STAGES`` says);
a workdir refuses different settings. Outputs: see the README.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax

from ipl_jax import distributed, storage
from ipl_jax.data.evolution import read_qas_jsonl
from ipl_jax.pipeline import (
    buckets_stage,
    data_stage,
    evolution_stage,
    export_stage,
    model_stage,
    report,
    rounds_stage,
    sft_stage,
    start_stage,
)
from ipl_jax.pipeline.eval_stage import dev_accuracy, evaluate_policy_splits, limit_episodes
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.sources import check_job
from ipl_jax.pipeline.workdir import Workdir, read_json, write_json
from ipl_jax.settings import Settings
from ipl_jax.settings.job import relocated
from ipl_jax.viz.plots import plot_step_accuracy_splits

STAGES = ("data", "evolution", "model", "buckets", "sft", "start", "eval_start", "rounds", "eval_export", "export")
# what a round entry of results.json takes from its evaluation besides ``metrics`` (eval_stage.evaluate_policy_splits)
EVAL_EXTRA = tuple(k for k in export_stage.EVAL_KEYS if k != "metrics")


def check_workdir_config(wd: Workdir, settings: Settings) -> None:
    """Record the settings in a new workdir; refuse different ones once a stage has finished there (before that the
    new settings replace the old)."""
    current = json.loads(json.dumps(settings.to_dict()))
    path = wd.path("config.json")
    if path.is_file():
        stored = json.loads(json.dumps(relocated(read_json(path), tell=False)))  # defaults moved in: as JSON
        diff = sorted(_diff_keys(stored, current))
        if diff and not any(wd.path("stages").glob("*.done")):
            wd.echo(
                f"no stage had finished in {wd.root}: recording the new config (fields changed: "
                f"{', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''})"
            )
            if wd.main:
                write_json(path, current)
        elif diff:
            raise UsageError(
                f"{wd.root} was made with a different config (fields differ: "
                f"{', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''}); rerun with the same "
                f"config to resume, or use a new --workdir"
            )
    elif wd.main:
        write_json(path, current)
    distributed.barrier("config recorded")


def _diff_keys(a, b, prefix=""):
    """Dotted names of the fields that differ; a field the stored config lacks counts only when not off."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in set(a) | set(b):
            if k not in a and not b[k]:
                continue
            yield from _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


class Job:
    """The job's state between stages: settings, workdir, and the data read from disk."""

    def __init__(self, settings: Settings, wd: Workdir):
        self.settings, self.wd = settings, wd
        self.splits: dict = {}
        self.t_start = time.perf_counter()

    # ----------------------------------------------------------------------------------------------- data

    def data(self) -> None:
        s, wd = self.settings, self.wd
        loaded: dict = {}
        if s.data.synthetic:
            wd.run_stage("data", lambda: data_stage.write_synthetic(s, wd), main_only=True)
        else:

            def read():  # inside the stage: a malformed record leaves it unfinished (and the config unpinned)
                loaded["splits"] = data_stage.load_splits(s.data, wd, s.seed)
                return {
                    "root": s.data.root,
                    "format": s.data.format,
                    "episodes": {k: len(v) for k, v in loaded["splits"].items()},
                }

            wd.run_stage("data", read)
        self.splits = loaded.get("splits") or data_stage.load_splits(s.data, wd, s.seed)
        # warm-up SFT's steps (the annotated ones), and the steps the rounds sample (the action-only episodes of a
        # scarce-annotation job, else the same training steps)
        self.train_steps = data_stage.steps_of(self.splits["train"])
        actions = self.splits.get(data_stage.ACTIONS)
        self.round_pool = self.train_steps if actions is None else data_stage.steps_of(actions)
        self.test_names = list(s.data.test_splits)
        self.dev = self.splits[s.data.dev_name]
        if actions is not None:
            wd.echo(
                f"  scarce annotations: {len(self.splits['train'])} annotated episodes ({len(self.train_steps)} "
                f"steps) for warm-up SFT, {len(actions)} action-only episodes ({len(self.round_pool)} steps) "
                f"for the IPL rounds"
            )
        data_stage.check_annotations(s, self.train_steps)

    def evolution(self) -> None:
        s = self.settings
        self.wd.run_stage(
            "evolution",
            lambda: evolution_stage.evolve(s.evolution, s.seed, self.wd, self.evolution_steps()),
            main_only=True,
        )
        self.qas = read_qas_jsonl(self.wd.path("evolution", "qas.jsonl"))

    def model(self) -> None:
        self.wd.run_stage(
            "model",
            lambda: model_stage.build_initial_model(self.settings, self.wd, self.corpus_steps(), self.qas),
            main_only=True,
        )

    def evolution_steps(self) -> list:
        """The screens evolution asks about: annotated training steps, plus action logs' with ``screens == "all"``."""
        if self.settings.evolution.screens == "annotated":
            return self.train_steps
        return self.corpus_steps()

    def corpus_steps(self) -> list:
        """The steps whose texts build a fresh tokenizer: the training steps and the action logs."""
        return self.train_steps + ([] if self.round_pool is self.train_steps else self.round_pool)

    def buckets(self) -> None:
        """The buckets checked against the data (``buckets_stage``, in every process); the job goes on with them."""
        s, wd = self.settings, self.wd
        fit = lambda: buckets_stage.fit_stage(s, wd, self.splits, self.train_steps, self.round_pool, self.qas)
        self.settings = buckets_stage.apply(s, wd.run_stage("buckets", fit))

    def sft(self) -> None:
        self.sft_summary = self.wd.run_stage(
            "sft", lambda: sft_stage.run_sft(self.settings, self.wd, self.train_steps, self.qas, self.round_pool)
        )

    def inference_policy(self, directory: Path) -> model_stage.Policy:
        """A policy directory as the job samples and evaluates it (``model_stage.inference_policy``)."""
        s = self.settings
        return model_stage.inference_policy(model_stage.load_policy(directory, model_stage.job_mesh(s.mesh)), s.model)

    # ------------------------------------------------------------------------------------ the starting policy

    def start(self) -> None:
        """The starting policy of the IPL rounds: the SFT candidate of the highest Acc_S + w · Div_R, in ``start/``."""

        def policies(paths):
            return [(p.name, self.inference_policy(p)) for p in paths]

        def select():
            return start_stage.select_start(self.settings, self.wd, self.sft_summary, self.train_steps, policies)

        self.start_summary = self.wd.run_stage("start", select)

    def eval_start(self) -> None:
        def run():
            policy = self.inference_policy(self.wd.existing("start"))
            t0 = time.perf_counter()
            out = evaluate_policy_splits(
                policy, self.splits, self.settings, self.wd.dir("eval", "round_0"), echo=self.wd.echo
            )
            out["dev"] = dev_accuracy(policy, self.dev, self.settings)
            out["eval_seconds"] = time.perf_counter() - t0
            return out

        fresh = not self.wd.is_done("eval_start")  # a round goes to TensorBoard once, when it runs
        self.start_eval = self.wd.run_stage("eval_start", run)
        if fresh:
            self.wd.tensorboard.round(self.results()["rounds"][0])

    # ----------------------------------------------------------------------------------------------- rounds

    def rounds(self) -> None:
        """The round loop, resumable round by round; with ``ipl.early_stop`` it stops after the first round not beating
        the best dev accuracy. Without ``eval.every_round`` only the last round is evaluated on the test splits."""
        s, wd = self.settings, self.wd
        start = wd.existing("start")
        best = float(self.start_eval["dev"]["step_accuracy"])
        self.round_summaries = []
        for r in range(1, s.ipl.rounds + 1):

            def run(r=r, start=start, best=best):
                t0 = time.perf_counter()
                record = rounds_stage.run_round(s, wd, r, start, self.round_pool, self.dev, annotated=self.train_steps)
                train_seconds = time.perf_counter() - t0
                stops = s.ipl.early_stop and float(record["dev"]["step_accuracy"]) <= best
                evaluation: dict = {"metrics": {}}
                if s.eval.every_round or stops or r == s.ipl.rounds:
                    policy = self.inference_policy(storage.as_path(record["policy"]))
                    evaluation = evaluate_policy_splits(
                        policy, self.splits, s, wd.dir("eval", f"round_{r}"), echo=wd.echo
                    )
                return {"record": record, **evaluation, "round_seconds": train_seconds}

            fresh = not wd.is_done(f"round_{r}")
            summary = wd.run_stage(f"round_{r}", run)
            self.round_summaries.append(summary)
            if fresh:
                wd.tensorboard.round(self.results()["rounds"][-1])
            wd.log_metrics(
                {
                    "stage": "ipl",
                    "round": r,
                    "pairs": summary["record"]["pairs"],
                    "classes": summary["record"]["classes"],
                    "dev": summary["record"]["dev"],
                }
            )
            self.print_rounds()
            start = storage.as_path(summary["record"]["policy"])
            acc = float(summary["record"]["dev"]["step_accuracy"])
            if s.ipl.early_stop and acc <= best:
                wd.echo(
                    f"  early stop: round {r} dev step accuracy {100 * acc:.2f}% does not beat the best "
                    f"({100 * best:.2f}%)"
                )
                break
            best = max(best, acc)

    # ----------------------------------------------------------------------------------------------- report

    def results(self) -> dict:
        start_trees = self.start_summary["trees"]
        start_extra = {k: self.start_eval[k] for k in EVAL_EXTRA if k in self.start_eval}
        out = [
            report.results_round(
                0,
                self.start_eval["metrics"],
                start_trees,
                0,
                self.start_eval["seconds"],
                dev=self.start_eval["dev"],
                **start_extra,
            )
        ]
        for s in getattr(self, "round_summaries", []):
            rec = s["record"]
            extra = {k: s[k] for k in EVAL_EXTRA if k in s}
            extra.update({k: rec[k] for k in ("method", "samples", "budget", "diagnostics") if k in rec})
            out.append(
                report.results_round(
                    rec["round"],
                    s["metrics"],
                    rec["classes"],
                    rec["pairs"],
                    s["seconds"],
                    dev=rec["dev"],
                    pairs_by_turn=rec.get("pairs_by_turn"),
                    pair_counts=rec.get("pair_counts"),
                    train=rec.get("train"),
                    **extra,
                )
            )
        res = {"data": self.data_use(), "rounds": out}
        chosen = getattr(self, "export_eval", None)
        if chosen is not None:
            self._add_export(res, chosen)
        return res

    def _add_export(self, res: dict, chosen: dict) -> None:
        """The exported round's evaluation made at export (into its round entry, ``evaluated_at_export``) and the
        top-level ``exported`` block (``export_stage.exported_block``)."""
        r = int(chosen["round"])
        entry = next(e for e in res["rounds"] if e["round"] == r)
        if chosen.get("evaluation"):
            entry.update({k: v for k, v in chosen["evaluation"].items() if k in export_stage.EVAL_KEYS})
            entry["evaluated_at_export"] = True
        dev = limit_episodes(self.dev, self.settings.eval.max_steps)
        use = {"episodes": len(dev), "steps": sum(len(e.steps) for e in dev)}
        res["exported"] = export_stage.exported_block(
            res["rounds"], r, bool(chosen.get("evaluation")), self.test_names, use
        )

    def data_use(self) -> dict:
        """Which episodes each stage used, and of which kind (SFT's, the rounds' pool, evolution's screens)."""
        actions = self.splits.get(data_stage.ACTIONS)
        rounds = self.splits["train"] if actions is None else actions
        return {
            "warmup_sft": {"kind": "annotated", "episodes": len(self.splits["train"]), "steps": len(self.train_steps)},
            "rounds": {
                "kind": "annotated" if actions is None else "action-only",
                "episodes": len(rounds),
                "steps": len(self.round_pool),
            },
            "evolution": {"screens": len(self.evolution_steps()), "items": len(self.qas)},
        }

    def print_rounds(self) -> None:
        self.wd.echo("\n" + report.data_line(self.data_use()))
        res = self.results()["rounds"]
        for split in self.test_names:
            self.wd.echo("\n" + report.round_table(res, split) + "\n")

    def round_policy(self, r: int) -> Path:
        """The policy directory of round ``r`` (0: the starting policy)."""
        return self.wd.existing("start") if r == 0 else self.wd.path("rounds", str(r), "policy")

    def eval_export(self) -> None:
        """Choose the round to export (``export_stage.choose_round``) and, when no stage evaluated it on the test
        splits and in the live world (an intermediate round under ``eval.every_round = false``), evaluate it now
        into ``eval/round_<r>``; an evaluated round (the starting policy, the last round) keeps its evaluation.
        Every process runs it (the evaluation is sharded)."""

        def run():
            rounds_ = self.results()["rounds"]
            r = export_stage.choose_round(rounds_)
            if export_stage.is_evaluated(next(e for e in rounds_ if e["round"] == r)):
                self.wd.echo(f"  exporting round {r}: evaluated when it ran, its scores are reused")
                return {"round": r}
            self.wd.echo(f"  exporting round {r}: not evaluated on the test splits yet, evaluating it now")
            policy = self.inference_policy(self.round_policy(r))
            out_dir = self.wd.dir("eval", f"round_{r}")
            return {
                "round": r,
                "evaluation": evaluate_policy_splits(policy, self.splits, self.settings, out_dir, echo=self.wd.echo),
            }

        self.export_eval = self.wd.run_stage("eval_export", run)

    def export(self) -> None:
        self.wd.run_stage("export", self._export, main_only=True)

    def _export(self) -> dict:
        wd = self.wd
        res = self.results()
        rounds_, chosen = res["rounds"], res["exported"]["round"]
        target = wd.path("export")
        storage.copy_tree(self.round_policy(chosen), target)
        write_json(wd.path("results.json"), res)
        plot = plot_step_accuracy_splits(rounds_, self.test_names, wd.path("step_accuracy.png"), exported=chosen)
        wd.tensorboard.image("ipl", "step_accuracy", plot, step=rounds_[-1]["round"])
        viewer = self._viewer()
        return {
            "export": str(target),
            "exported_round": chosen,
            "plot": str(plot),
            "viewer": viewer,
            "results": str(wd.path("results.json")),
        }

    def job_report(self) -> dict:
        """``job_report.json`` (``report.job_report``) from the stage log and markers (main process)."""
        rounds_ = []
        for r in range(1, self.settings.ipl.rounds + 1):
            summary = self.wd.summary(f"round_{r}")
            if summary is not None:
                rounds_.append(summary["record"])
        device = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
        out = report.job_report(self.wd.stage_log(), self.wd.summary("sft"), rounds_, device)
        if self.wd.main:
            write_json(self.wd.path("job_report.json"), out)
        return out

    def _viewer(self):
        """The last round's tree viewer page as ``WORKDIR/trees.html``."""
        last = max([0] + [s["record"]["round"] for s in getattr(self, "round_summaries", [])])
        page = self.wd.path("rounds", str(last), "trees.html")
        if last == 0 or not page.is_file():
            return None
        return str(storage.copy_file(page, self.wd.path("trees.html")))


def run_job(settings: Settings, workdir: str | Path, stop_after: str | None = None, echo=print) -> Workdir:
    """Run (or resume) the job in ``workdir``; returns its Workdir.

    ``sources.check_job`` runs first (an error leaves the workdir untouched); under a multi-process launcher
    ``jax.distributed`` starts here unless it already has. The workdir records ``settings`` as configured; the job
    runs with them resolved on this machine, once (``Settings.resolved``: concrete dtypes and mesh)."""
    distributed.initialize()
    check_job(settings)
    wd = Workdir(workdir, echo=echo)
    check_workdir_config(wd, settings)
    job = Job(settings.resolved(jax.device_count()), wd)
    for stage in STAGES:
        getattr(job, stage)()
        report_ = job.job_report()  # after every stage: a job stopped later still leaves its figures so far
        if stage == stop_after:
            break
    wd.tensorboard.close()
    if stop_after is None:
        job.print_rounds()
        wd.echo("\n" + export_stage.export_report(job.results()["exported"]) + "\n")
        total = sum(e.get("seconds", 0.0) for e in wd.stage_log() if e["event"] == "finished")
        wd.echo(
            f"results: {wd.path('results.json')}  (stage time {total:.0f} s across invocations; "
            f"this invocation {time.perf_counter() - job.t_start:.0f} s)"
        )
    wd.echo("\n" + report.stage_table(report_))
    return wd
