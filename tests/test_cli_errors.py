"""Bad invocations of ``ipl-jax``: each ends in one line on stderr that names what is wrong and what to do, with
exit status 2 for a usage error (1 for a malformed data record), before any expensive work; a job directory that
saw the bad invocation still resumes. The commands run in-process (``ipl_jax.cli.main``)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from ipl_jax import cli
from ipl_jax.data import annotator

GOOD_JOB = ["run", "--config", "synthetic:quick", "--stop-after", "data"]


@dataclasses.dataclass(frozen=True)
class Files:
    root: Path
    aitz: Path  # AITZ train and test splits written by ipl-jax synth
    aitz_escape: Path  # the same with one record's image_path pointing outside the dataset root
    amex_dup: Path  # an AMEX episode with a repeated step_id
    preds: Path
    a_file: Path
    corrupt_model: Path  # config.json + a model.safetensors that is not one
    workdir: Path  # a job directory with its data stage finished
    fresh: Path  # a path where no job directory exists


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Files:
    root = tmp_path_factory.mktemp("bad_inputs")
    aitz = root / "aitz"
    for split in ("train", "test"):
        assert cli.main(["synth", "--out", str(aitz), "--split", split, "--episodes", "2", "--seed", "3"]) == 0
    escape = root / "aitz_escape"
    shutil.copytree(aitz, escape)
    first = sorted(escape.glob("test/*/*/*.json"))[0]
    records = json.loads(first.read_text())
    records[1]["image_path"] = "../../outside.png"
    first.write_text(json.dumps(records))
    amex = root / "amex_dup"
    (amex / "instruction_anno").mkdir(parents=True)
    (amex / "screenshot").mkdir()
    Image.new("RGB", (108, 240), (90, 90, 90)).save(amex / "screenshot" / "s0.png")
    step = {"step_id": 0, "image_path": "s0.png", "action": "PRESS_BACK", "device_dim": [108, 240]}
    (amex / "instruction_anno" / "ep1.json").write_text(
        json.dumps(
            {"episode_id": "ep1", "instruction": "Open Gmail.", "steps": [step, {**step, "action": "TASK_COMPLETE"}]}
        )
    )
    preds = root / "preds.jsonl"
    preds.write_text(json.dumps({"episode_id": "0", "step_id": 0, "prediction": {"type": "stop"}}) + "\n")
    a_file = root / "a_file"
    a_file.write_text("not a directory")
    corrupt = root / "corrupt_model"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{}")
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    workdir = root / "job"
    assert cli.main(GOOD_JOB + ["--workdir", str(workdir)]) == 0
    return Files(root, aitz, escape, amex, preds, a_file, corrupt, workdir, root / "no_job_here")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    argv: Callable[[Files], list[str]]
    rc: int
    message: str  # a regular expression the one stderr line must match
    job: bool = False  # touches f.workdir: a rerun of GOOD_JOB there must still resume
    setup: Callable | None = None  # (monkeypatch) -> None


def _run(f: Files, *extra: str) -> list[str]:
    return ["run", "--config", "synthetic:quick", "--workdir", str(f.workdir), *extra]


def _bad_flag(name: str, flag: str, message: str) -> Case:
    """``ipl-jax run`` on the quick job's workdir with one bad ``flag``: exit 2, one line matching ``message``."""
    return Case(name, lambda f: _run(f, flag), 2, message, job=True)


def _fresh(command: str, *extra: str) -> Callable[[Files], list[str]]:
    """``ipl-jax COMMAND`` of the quick job on a new workdir, with ``extra`` flags."""
    return lambda f: [command, "--config", "synthetic:quick", "--workdir", str(f.fresh), *extra]


def _paper(f: Files, *extra: str) -> list[str]:
    return ["run", "--config", "qwen2vl_2b_aitz", "--workdir", str(f.fresh), *extra]


def _two_devices(monkeypatch):
    import jax

    monkeypatch.setattr(jax, "device_count", lambda: 2)


CASES = [
    # ------------------------------------------------------------------ job config: values, files, variants
    _bad_flag(
        "unknown ipl.method",
        "--config.ipl.method=tdpoo",
        r"^ipl-jax run: config\.ipl\.method='tdpoo': must be one of tdpo, .*, grpo, ppo, gigppo \(fix it with "
        r"--config\.ipl\.method=\.\.\.\)$",
    ),
    _bad_flag(
        "negative lr",
        "--config.sft.learning_rate=-1e-3",
        r"^ipl-jax run: config\.sft\.learning_rate=-0\.001: must be > 0 \(fix it with",
    ),
    _bad_flag(
        "negative ipl lr",
        "--config.ipl.learning_rate=-1e-6",
        r"^ipl-jax run: config\.ipl\.learning_rate=-1e-06: must be > 0 \(fix it with",
    ),
    _bad_flag(
        "unknown data store",
        "--config.data.store=parquet",
        r"^ipl-jax run: config\.data\.store='parquet': must be aitz or arrayrecord",
    ),
    _bad_flag(
        "branching 0",
        "--config.sampler.tree.branching=(3,0,3,1)",
        r"^ipl-jax run: config\.sampler\.tree\.branching=\(3, 0, 3, 1\): must be four integers >= 1",
    ),
    _bad_flag(
        "negative seed",
        "--config.seed=-4",
        r"^ipl-jax run: config\.seed=-4: must be an integer in \[0, 4294967295\]",
    ),
    Case(
        "batch not divisible by the mesh",
        lambda f: _run(f, "--config.eval.batch_size=3"),
        2,
        r"^ipl-jax run: config\.eval\.batch_size=3: not divisible by the mesh's batch axes \(data x fsdp = 2 on "
        r"2 devices\).*use a multiple of 2$",
        job=True,
        setup=_two_devices,
    ),
    Case(
        "mesh that does not match the device count",
        lambda f: _run(f, "--config.mesh.data=3"),
        2,
        r"^ipl-jax run: config\.mesh \(data, fsdp, tensor\) = \(3, 1, 1\) does not fit 2 devices",
        job=True,
        setup=_two_devices,
    ),
    Case(
        "incomplete multi-process flags",
        lambda f: _run(f, "--process-id", "1"),
        2,
        r"^ipl-jax run: --coordinator, --num-processes: missing; a multi-process launch needs all of",
        job=True,
    ),
    Case(
        "process id out of range",
        lambda f: [
            "eval",
            "--model",
            str(f.workdir),
            "--data",
            str(f.workdir),
            "--format",
            "aitz",
            "--coordinator",
            "localhost:1",
            "--num-processes",
            "2",
            "--process-id",
            "2",
        ],
        2,
        r"^ipl-jax eval: --process-id=2: must be in 0\.\.1 \(--num-processes\)$",
    ),
    _bad_flag(
        "unknown data.format",
        "--config.data.format=aitzz",
        r"^ipl-jax run: config\.data\.format='aitzz': must be one of synthetic, aitz, amex, androidcontrol.* or "
        r"tfds:NAME \(fix it with --config\.data\.format=\.\.\.\)$",
    ),
    _bad_flag(
        "unknown field",
        "--config.sft.stepz=3",
        r"^ipl-jax run: .*unknown config field 'sft\.stepz' \(fields at sft: .*\)",
    ),
    Case(
        "unknown config variant",
        lambda f: ["run", "--config", "synthetic:quik", "--workdir", str(f.fresh)],
        2,
        r"^ipl-jax run: configs/synthetic\.py: unknown variant 'quik' "
        r"\(expected nothing, reader, quick, full, scarce or gpu\)",
    ),
    Case(
        "missing config file",
        lambda f: ["run", "--config", str(f.root / "mine.py"), "--workdir", str(f.fresh)],
        2,
        r"^ipl-jax run: config '.*mine\.py': no such file",
    ),
    Case(
        "workdir is a file",
        lambda f: ["run", "--config", "synthetic:quick", "--workdir", str(f.a_file)],
        2,
        r"^ipl-jax run: --workdir .*a_file: exists and is not a directory",
    ),
    Case(
        "paper config without checkpoint and data",
        lambda f: _paper(f),
        2,
        r"^ipl-jax run: config\.data\.root and config\.model\.checkpoint are empty: .*pass "
        r"--config\.data\.root=DIR --config\.model\.checkpoint=DIR",
    ),
    Case(
        "paper config without checkpoint",
        lambda f: _paper(f, f"--config.data.root={f.aitz}"),
        2,
        r"^ipl-jax run: config\.model\.checkpoint is empty: a job on aitz data starts from a Hugging Face "
        r"checkpoint; "
        r"pass --config\.model\.checkpoint=DIR",
    ),
    Case(
        "paper config, data.root missing",
        lambda f: _paper(f, f"--config.data.root={f.root / 'nope'}", f"--config.model.checkpoint={f.corrupt_model}"),
        2,
        r"^ipl-jax run: config\.data\.root='.*nope': no such directory; pass --config\.data\.root=DIR",
    ),
    Case(
        "paper config, corrupt checkpoint",
        lambda f: _paper(
            f,
            f"--config.data.root={f.aitz}",
            "--config.data.test_splits=('test',)",
            f"--config.model.checkpoint={f.corrupt_model}",
        ),
        2,
        r"^ipl-jax run: config\.model\.checkpoint .*model\.safetensors: not a valid safetensors file \(.*\); "
        r"re-download or re-export the model$",
    ),
    Case(
        "sft bad value",
        lambda f: ["sft", "--config", "synthetic:quick", "--workdir", str(f.workdir), "--config.sft.batch_size=0"],
        2,
        r"^ipl-jax sft: config\.sft\.batch_size=0: must be >= 1",
        job=True,
    ),
    Case(
        "ablate unknown variant",
        _fresh("ablate", "--variants", "tdpo,k9"),
        2,
        r"^ipl-jax ablate: --variants: unknown variant 'k9'; known: tdpo, ",
    ),
    Case(
        "ablate own variant outside the rounds",
        _fresh("ablate", "--variant", "a=sft.steps=3"),
        2,
        r"^ipl-jax ablate: --variant 'a=sft.steps=3': 'sft.steps' is not a round setting \(ipl\.\* or rl\.\*\)",
    ),
    Case(
        "ablate own variant bad value",
        _fresh("ablate", "--variant", "b=tdpo ipl.dpo.beta=x"),
        2,
        r"^ipl-jax ablate: --variant b: ipl\.dpo\.beta: must be a number",
    ),
    Case(
        "ablate bad seeds",
        _fresh("ablate", "--seeds", "0,1,1"),
        2,
        r"^ipl-jax ablate: --seeds: '0,1,1' is not a comma-separated list of distinct non-negative integers",
    ),
    Case(
        "ablate seed out of range",
        _fresh("ablate", "--seeds", "0,4294967296"),
        2,
        r"^ipl-jax ablate: config\.seed=4294967296: must be an integer in \[0, 4294967295\]",
    ),
    Case(
        "ablate bad rl value",
        _fresh("ablate", "--variants", "tdpo,ppo", "--config.rl.ppo.gamma_dense=1.5"),
        2,
        r"^ipl-jax ablate: config\.rl\.ppo\.gamma_dense=1\.5: must be in \[0, 1\] \(fix it with "
        r"--config\.rl\.ppo\.gamma_dense=\.\.\.\)$",
    ),
    Case(
        "gigppo without sibling trajectories",
        _fresh("run", "--config.ipl.method=gigppo", "--config.rl.ppo.trajectories_per_task=1"),
        2,
        r"^ipl-jax run: config\.rl\.ppo\.trajectories_per_task=1: must be >= 2 with gigppo",
    ),
    # ------------------------------------------------------------------ score / eval / sample
    Case(
        "eval --online unknown split",
        lambda f: ["eval", "--online", "--model", str(f.corrupt_model), "--split", "nope"],
        2,
        r"^ipl-jax eval: --split 'nope': the synthetic world's splits are train, dev, test, ",
    ),
    Case(
        "eval --env androidworld without a server",
        lambda f: ["eval", "--env", "androidworld", "--model", str(f.corrupt_model)],
        2,
        r"^ipl-jax eval: --env-url: must name one or more servers with env\.kind=androidworld$",
    ),
    Case(
        "eval --env-url not a URL",
        lambda f: ["eval", "--env", "androidworld", "--env-url", "localhost:5000", "--model", str(f.corrupt_model)],
        2,
        r"^ipl-jax eval: --env-url: 'localhost:5000' is not an http\(s\):// URL$",
    ),
    Case(  # no server there (or, until the client is merged, no client): one line before the model loads
        "eval --env-url unreachable",
        lambda f: ["eval", "--env", "androidworld", "--env-url", "http://127.0.0.1:9", "--model", str(f.corrupt_model)],
        2,
        r"^ipl-jax eval: --env-url: .*(client not available|127\.0\.0\.1:9)",
    ),
    Case(
        "eval --tasks naming no task",
        lambda f: ["eval", "--env", "androidworld", "--env-url", "http://127.0.0.1:9", "--tasks", ",,", "--model", "x"],
        2,
        r"^ipl-jax eval: --tasks ',,': names no task \(NAME,NAME,\.\.\.; leave it out for the whole suite\)$",
    ),
    Case(
        "eval without --data",
        lambda f: ["eval", "--model", str(f.corrupt_model), "--format", "aitz"],
        2,
        r"^ipl-jax eval: .*required: --data",
    ),
    Case(
        "score predictions is a directory",
        lambda f: ["score", "--data", str(f.aitz), "--format", "aitz", "--predictions", str(f.root)],
        2,
        r"^ipl-jax score: --predictions .*: is a directory, expected a predictions JSONL file$",
    ),
    Case(
        "score --json unwritable",
        lambda f: [
            "score",
            "--data",
            str(f.aitz),
            "--format",
            "aitz",
            "--predictions",
            str(f.preds),
            "--json",
            str(f.a_file / "t.json"),
        ],
        2,
        r"^ipl-jax score: --json .*a_file/t\.json: cannot be created because .*a_file is a file; choose another "
        r"path$",
    ),
    Case(
        "score --json is a directory",
        lambda f: [
            "score",
            "--data",
            str(f.aitz),
            "--format",
            "aitz",
            "--predictions",
            str(f.preds),
            "--json",
            str(f.root),
        ],
        2,
        r"^ipl-jax score: --json .*: is a directory; give a file path$",
    ),
    Case(
        "score missing split",
        lambda f: ["score", "--data", str(f.aitz), "--format", "aitz", "--predictions", str(f.preds), "--split", "dev"],
        2,
        r"^ipl-jax score: --data .* --split dev: AITZ split directory not found",
    ),
    Case(
        "eval corrupt safetensors",
        lambda f: ["eval", "--model", str(f.corrupt_model), "--data", str(f.aitz), "--format", "aitz"],
        2,
        r"^ipl-jax eval: --model .*model\.safetensors: not a valid safetensors file",
    ),
    Case(
        "sample corrupt safetensors",
        lambda f: [
            "sample",
            "--model",
            str(f.corrupt_model),
            "--data",
            str(f.aitz),
            "--out",
            str(f.root / "t.jsonl"),
        ],
        2,
        r"^ipl-jax sample: --model .*model\.safetensors: not a valid safetensors file",
    ),
    Case(
        "the old spelling --checkpoint is gone",
        lambda f: ["sample", "--checkpoint", str(f.corrupt_model), "--data", str(f.aitz), "--out", str(f.root / "t")],
        2,
        r"^ipl-jax sample: the following arguments are required: --model",
    ),
    Case(
        "export corrupt safetensors",
        lambda f: ["export", "--model", str(f.corrupt_model), "--out", str(f.root / "exp")],
        2,
        r"^ipl-jax export: --model .*: not a valid safetensors file",
    ),
    Case(
        "eval without --model",
        lambda f: ["eval", "--data", str(f.aitz), "--format", "aitz"],
        2,
        r"^ipl-jax eval: the following arguments are required: --model/--checkpoint \(see ipl-jax eval --help\)$",
    ),
    # ------------------------------------------------------------------ synth
    Case(
        "synth --out is a file",
        lambda f: ["synth", "--out", str(f.a_file), "--split", "dev", "--episodes", "1"],
        2,
        r"^ipl-jax synth: --out .*a_file: exists and is not a directory; choose a directory path$",
    ),
    Case(
        "synth --png-level 12",
        lambda f: ["synth", "--out", str(f.root / "s"), "--png-level", "12"],
        2,
        r"^ipl-jax synth: argument --png-level: invalid choice: 12 \(choose from 0, 1, .* 9\)",
    ),
    Case(
        "synth --seed -1",
        lambda f: ["synth", "--out", str(f.root / "s"), "--seed", "-1"],
        2,
        r"^ipl-jax synth: argument --seed: '-1' must be >= 0 \(see ipl-jax synth --help\)$",
    ),
    Case(
        "synth into a non-empty split",
        lambda f: ["synth", "--out", str(f.aitz), "--split", "test", "--episodes", "1"],
        2,
        r"^ipl-jax synth: --out .*aitz: split folder .*test already holds files \(2 episodes\); pass "
        r"--overwrite to replace it, or choose another --out$",
    ),
    Case(
        "synth unknown world field",
        lambda f: ["synth", "--out", str(f.root / "s"), "--world", "colour=red"],
        2,
        r"^ipl-jax synth: --world 'colour=red': expected k=v with k one of",
    ),
    # ------------------------------------------------------------------ datasets
    Case(
        "AITZ image path outside the root",
        lambda f: ["score", "--data", str(f.aitz_escape), "--format", "aitz", "--predictions", str(f.preds)],
        1,
        r"^ipl-jax score: .*\.json: record 1: field 'image_path': '\.\./\.\./outside\.png' points outside the "
        r"dataset root .*aitz_escape; image paths must stay inside it$",
    ),
    Case(
        "AMEX duplicate step ids",
        lambda f: [
            "score",
            "--data",
            str(f.amex_dup),
            "--format",
            "amex",
            "--split",
            "all",
            "--predictions",
            str(f.preds),
        ],
        1,
        r"^ipl-jax score: .*ep1\.json: record steps\[1\]: field 'step_id': duplicate step_id 0 \(also steps\[0\]\)",
    ),
    Case("unknown command", lambda f: ["scroe"], 2, r"^ipl-jax: unknown command 'scroe'.*ipl-jax --help"),
]


def _job_state(f: Files):
    return (f.workdir / "config.json").read_text(), sorted(p.name for p in (f.workdir / "stages").iterdir())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_invocation(case: Case, files: Files, capsys, monkeypatch):
    if case.setup is not None:
        case.setup(monkeypatch)
    before = _job_state(files)
    capsys.readouterr()
    rc = cli.main(case.argv(files))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == case.rc, err
    assert len(err) == 1, err
    assert re.search(case.message, err[0]), err[0]
    assert not files.fresh.exists()  # nothing was created for a job that was refused
    assert _job_state(files) == before
    if case.job:  # the same job directory resumes: the finished stage is skipped, nothing is redone
        monkeypatch.undo()
        assert cli.main(GOOD_JOB + ["--workdir", str(files.workdir)]) == 0
        log = [json.loads(line) for line in (files.workdir / "stage_log.jsonl").read_text().splitlines()]
        assert log[-1] == {**log[-1], "stage": "data", "event": "skipped"}
        assert _job_state(files) == before


NOWHERE = "/proc/ipl-jax-nowhere"  # /proc refuses new directories, whoever runs the test


OUTPUTS = {  # every output path of every command, given a place that cannot be created
    "run --workdir": lambda f: ["run", "--config", "synthetic:quick", "--workdir", f"{NOWHERE}/job"],
    "sft --workdir": lambda f: ["sft", "--config", "synthetic:quick", "--workdir", f"{NOWHERE}/job"],
    "ablate --workdir": lambda f: ["ablate", "--config", "synthetic:quick", "--workdir", f"{NOWHERE}/job"],
    "score --json": lambda f: [
        "score",
        "--data",
        str(f.aitz),
        "--format",
        "aitz",
        "--predictions",
        str(f.preds),
        "--json",
        f"{NOWHERE}/s.json",
    ],
    "synth --out": lambda f: ["synth", "--out", f"{NOWHERE}/synth", "--split", "dev", "--episodes", "1"],
    "eval --json": lambda f: [
        "eval",
        "--model",
        str(f.corrupt_model),
        "--data",
        str(f.aitz),
        "--format",
        "aitz",
        "--json",
        f"{NOWHERE}/e.json",
    ],
    "eval --predictions": lambda f: [
        "eval",
        "--model",
        str(f.corrupt_model),
        "--data",
        str(f.aitz),
        "--format",
        "aitz",
        "--predictions",
        f"{NOWHERE}/p.jsonl",
    ],
    "eval --online --json": lambda f: ["eval", "--online", "--model", str(f.corrupt_model), "--json", f"{NOWHERE}/o"],
    "sample --out": lambda f: [
        "sample",
        "--model",
        str(f.corrupt_model),
        "--data",
        str(f.aitz),
        "--out",
        f"{NOWHERE}/t",
    ],
    "sample --html": lambda f: [
        "sample",
        "--model",
        str(f.corrupt_model),
        "--data",
        str(f.aitz),
        "--out",
        str(f.root / "trees.jsonl"),
        "--html",
        f"{NOWHERE}/t.html",
    ],
    "select-start --json": lambda f: [
        "select-start",
        "--models",
        str(f.corrupt_model),
        "--data",
        str(f.aitz),
        "--json",
        f"{NOWHERE}/start.json",
    ],
    "export --out": lambda f: ["export", "--model", str(f.corrupt_model), "--out", f"{NOWHERE}/export"],
    "make-tiny --out": lambda f: ["make-tiny", "--out", f"{NOWHERE}/tiny"],
    "init-model --out": lambda f: ["init-model", "--architecture", "qwen2-vl-2b", "--out", f"{NOWHERE}/init"],
    "pack-data --out": lambda f: ["pack-data", "--format", "aitz", "--data", str(f.aitz), "--out", f"{NOWHERE}/pk"],
    "plan --json": lambda f: ["plan", "--config", "synthetic:quick", "--json", f"{NOWHERE}/plan.json"],
}


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux) for a path that cannot be created")
@pytest.mark.parametrize("name", list(OUTPUTS))
def test_every_output_path_is_checked_before_work(name: str, files: Files, capsys):
    """An output that cannot be created ends in one line naming the flag and the path, before any work, and
    leaves nothing behind (the probe removes what it made)."""
    capsys.readouterr()
    rc = cli.main(OUTPUTS[name](files))
    err = capsys.readouterr().err.strip().splitlines()
    command, flag = name.split()[0], name.split()[-1]
    assert rc == 2 and len(err) == 1, err
    assert re.match(
        rf"^ipl-jax {command}: {flag} {NOWHERE}/\S+: cannot be written \(.+\); choose a writable location$", err[0]
    ), err[0]
    assert not (files.root / "trees.jsonl").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux) for a path that cannot be created")
def test_a_former_command_name_still_runs_with_a_notice(files: Files, capsys):
    """``select-seed`` is ``select-start`` now: the old name runs it, saying so in one line before its own output."""
    capsys.readouterr()
    rc = cli.main(["select-seed", *OUTPUTS["select-start --json"](files)[1:]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 2, err
    assert err[0] == "ipl-jax select-seed is ipl-jax select-start now; the old name still works"
    assert err[1].startswith(f"ipl-jax select-start: --json {NOWHERE}/start.json: cannot be written"), err[1]


def test_skip_bad_reports_what_was_skipped(files: Files, capsys):
    rc = cli.main(
        ["score", "--data", str(files.aitz_escape), "--format", "aitz", "--predictions", str(files.preds), "--skip-bad"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0 and len(err) == 1
    assert re.match(
        r"^ipl-jax score: skipped 1 malformed record in .*aitz_escape \(aitz, split test\) \(by field: "
        r"image_path: 1\); first: .*points outside the dataset root",
        err[0],
    ), err[0]


def test_job_skip_bad_from_the_config(files: Files):
    """``data.skip_bad`` reaches the job's readers: the bad record is left out and reported; without it the
    reader stops on the record."""
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.data.records import DataError
    from ipl_jax.pipeline.data_stage import load_splits
    from ipl_jax.pipeline.workdir import Workdir

    args = [
        "--config.data.format=aitz",
        f"--config.data.root={files.aitz_escape}",
        "--config.data.dev_split=test",
        "--config.data.test_splits=('test',)",
        "--config.data.action_episodes=0",
        "--config.eval.online_episodes=0",
    ]
    lines: list[str] = []
    wd = Workdir(files.root / "skip_job", echo=lines.append)
    with pytest.raises(DataError, match="points outside the dataset root"):
        load_splits(load_settings("synthetic:quick", args).data, wd, seed=0)
    splits = load_splits(load_settings("synthetic:quick", args + ["--config.data.skip_bad=true"]).data, wd, seed=0)
    n_steps = sum(len(e.steps) for e in splits["test"])
    full = sum(len(json.loads(p.read_text())) for p in files.aitz.glob("test/*/*/*.json"))
    assert n_steps == full - 1
    assert len(lines) == 1 and all("skipped 1 malformed record" in line and "image_path: 1" in line for line in lines)


def test_synth_overwrite_replaces_the_split(files: Files, tmp_path):
    out = tmp_path / "synth"
    assert cli.main(["synth", "--out", str(out), "--split", "dev", "--episodes", "3"]) == 0
    assert (
        cli.main(["synth", "--out", str(out), "--split", "dev", "--episodes", "1", "--seed", "7", "--overwrite"]) == 0
    )
    episodes = sorted(p.name for p in out.glob("dev/*/*"))
    assert len(episodes) == 1 and "0007" in episodes[0]  # only the new run's episode; seed 7 is in its id


@pytest.mark.parametrize(
    "url, ok",
    [
        ("https://api.example.com/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://127.0.0.1:9/v1", True),
        ("http://[::1]:8080/v1", True),
        ("http://api.example.com/v1", False),
        ("ftp://example.com", False),
        ("api.example.com/v1", False),
    ],
)
def test_annotator_sends_the_key_over_https_only(url, ok, monkeypatch):
    if ok:
        annotator.check_base_url(url)
        return
    monkeypatch.setenv("IPL_TEST_KEY", "sk-secret")
    config = annotator.AnnotatorConfig(base_url=url, model="m", api_key_env="IPL_TEST_KEY")
    with pytest.raises(annotator.AnnotatorError, match="https") as err:
        annotator.annotate_steps(iter(()), config)  # refused before any screen is encoded or request sent
    assert "sk-secret" not in str(err.value)


def test_version(capsys):
    from importlib import metadata

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ipl-jax {metadata.version('ipl-jax')}"


def test_processes_of_one_job_probe_the_same_new_workdir_at_once(tmp_path):
    """Every process of a multi-process job checks ``--workdir`` before work: probes of one new path that overlap
    (each makes the directory, writes a file, removes what it made) all pass and leave no file behind (a directory
    one process made may stay where another was probing inside it: the job makes it anyway)."""
    import multiprocessing

    target = tmp_path / "new" / "workdir"
    with multiprocessing.get_context("spawn").Pool(4) as pool:  # not fork: JAX has threads in this process
        outcomes = pool.map(_probe_many, [str(target)] * 8)
    assert outcomes == ["ok"] * 8
    assert not [p for p in tmp_path.rglob("*") if not p.is_dir()]


def _probe_many(path: str) -> str:
    from ipl_jax.pipeline.paths import output_dir

    try:
        for _ in range(200):
            output_dir(path, "--workdir")
    except Exception as e:  # reported to the test, which names it
        return f"{type(e).__name__}: {e}"
    return "ok"
