"""The job configs live in the repository's top-level ``configs/`` and are the package ``ipl_jax.configs``
however ipl-jax is used: installed from a wheel, installed in editable mode, or run from a plain checkout; each
finds ``--config synthetic`` (and ``synthetic:quick``) by name from another directory.

Offline and quick: the wheel is built without build isolation, each new environment has no pip of its own (this
environment's pip installs into it with ``--python``) and sees this environment's packages through a ``.pth``
file, so only ipl-jax itself is installed (``--no-deps --no-index``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


def _run(cmd, cwd, timeout=600, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _checkout(dst: Path) -> Path:
    """A copy of the checkout's sources (building in it leaves nothing in the checkout itself)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("ipl_jax", "configs"):
        shutil.copytree(REPO / name, dst / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    return dst


def _venv(path: Path) -> tuple[Path, Path]:
    """A fresh environment without pip that sees this environment's packages: (its python, its site-packages)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    _run([base, "-m", "venv", "--without-pip", path], cwd=path.parent)
    py = path / "bin" / "python"
    site = Path(
        _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], path.parent).stdout.strip()
    )
    (site / "ipl_jax_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, venv ipl-jax script, a working directory outside the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    src = _checkout(root / "src")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist", "."],
        cwd=src,
    )
    (wheel,) = (root / "dist").glob("ipl_jax-*.whl")
    venv = root / "venv"
    py, site = _venv(venv)
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel], cwd=root)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return {"python": py, "ipl_jax": venv / "bin" / "ipl-jax", "cwd": elsewhere, "wheel": wheel, "site": site}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_wheel_ships_the_configs_and_the_command(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    shipped = {p.relative_to(REPO).as_posix() for p in (REPO / "ipl_jax").rglob("*.py")}
    shipped |= {"ipl_jax/" + p.relative_to(REPO).as_posix() for p in (REPO / "configs").glob("*.py")}
    assert shipped <= names, sorted(shipped - names)[:5]
    assert {"ipl_jax/configs/synthetic.py", "ipl_jax/configs/qwen2vl_7b_aitz.py"} <= names
    assert {"ipl_jax/checkpoints/reader/model.safetensors", "ipl_jax/checkpoints/reader/recipe.json"} <= names
    assert not [n for n in names if n.startswith("configs/")]  # one copy, inside the package
    where = _run([installed["python"], "-c", "import ipl_jax; print(ipl_jax.__file__)"], installed["cwd"], env=_env())
    assert Path(where.stdout.strip()).is_relative_to(installed["site"])  # the installed copy, not the checkout
    version = _run([installed["ipl_jax"], "--version"], installed["cwd"], env=_env())
    assert version.stdout.strip() == "ipl-jax 0.1.0"


SMALL = [
    "--config.data.train_episodes=3",
    "--config.data.annotated_episodes=1",
    "--config.data.action_episodes=2",
    "--config.data.dev_episodes=1",
    "--config.data.test_episodes=1",
]


def _data_stage(command: list, cwd: Path, workdir: Path, env: dict) -> dict:
    """The data stage of ``--config synthetic`` (a few episodes) run by ``command``; returns the recorded config."""
    _run([*command, "run", "--config", "synthetic", *SMALL, "--stop-after", "data", "--workdir", workdir], cwd, env=env)
    assert len(list((workdir / "data" / "train").glob("*/*/*.json"))) == 3
    return json.loads((workdir / "config.json").read_text())


def test_the_configs_are_found_from_a_wheel_an_editable_install_and_a_plain_checkout(installed, tmp_path):
    """``--config synthetic`` resolves to the checkout's ``configs/synthetic.py`` (as ``ipl_jax.configs``) in the
    three ways of running ipl-jax, from a directory outside the checkout."""
    from ipl_jax.configs.loader import load_settings

    want = json.loads(json.dumps(load_settings("synthetic", SMALL).to_dict()))
    wheel = _data_stage([installed["ipl_jax"]], installed["cwd"], tmp_path / "wheel", _env())
    editable_src = _checkout(tmp_path / "editable_src")
    py, _ = _venv(tmp_path / "editable")
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-build-isolation", "-q"]
    _run([*pip, "-e", editable_src], cwd=tmp_path)
    editable = _data_stage([tmp_path / "editable" / "bin" / "ipl-jax"], tmp_path, tmp_path / "editable_job", _env())
    plain_src = _checkout(tmp_path / "plain_src")
    py, _ = _venv(tmp_path / "plain")  # nothing of ipl-jax installed: the sources on PYTHONPATH
    plain_env = {**_env(), "PYTHONPATH": str(plain_src)}
    plain = _data_stage([py, "-m", "ipl_jax.cli"], tmp_path, tmp_path / "plain_job", plain_env)
    assert wheel == editable == plain == want
    where = _run([py, "-c", "import ipl_jax.configs.synthetic as m; print(m.__file__)"], tmp_path, env=plain_env)
    assert Path(where.stdout.strip()) == plain_src / "configs" / "synthetic.py"


def test_installed_command_finds_its_configs(installed):
    """The first stage of the quick job from outside the checkout: the shipped config resolves by name."""
    workdir = installed["cwd"] / "data_only"
    _run(
        [installed["ipl_jax"], "run", "--config", "synthetic:quick", "--stop-after", "data", "--workdir", workdir],
        installed["cwd"],
        env=_env(),
    )
    config = json.loads((workdir / "config.json").read_text())
    assert config["data"]["train_episodes"] == 24  # the :quick variant's value, not the default's 300
    assert (workdir / "stages" / "data.done").is_file()
    assert len(list((workdir / "data" / "train").glob("*/*/*.json"))) == 24


@pytest.mark.slow
def test_installed_command_runs_the_quick_job(installed):
    """``ipl-jax run --config synthetic:quick`` end to end from the wheel (about 2 minutes on 2 CPU cores)."""
    workdir = installed["cwd"] / "quick"
    proc = _run(
        [installed["ipl_jax"], "run", "--config", "synthetic:quick", "--workdir", workdir],
        installed["cwd"],
        timeout=1800,
        env=_env(),
    )
    results = json.loads((workdir / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [0, 1]
    assert set(results["rounds"][0]["metrics"]) == {"test", "test_app_unseen", "test_task_unseen"}
    assert (workdir / "export" / "model.safetensors").is_file()
    assert "\r" not in proc.stderr  # progress is written as lines when not on a terminal


def _env_with_jax(root: Path, version: str) -> Path:
    """A fresh environment whose JAX and jaxlib are ``version`` (their distribution metadata: what pip reads) and
    whose other packages are this environment's (seen through a ``.pth`` file, after its own)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    venv = root / f"jax-{version}"
    _run([base, "-m", "venv", "--without-pip", venv], cwd=root)
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip())
    for name in ("jax", "jaxlib"):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text("")
    (site / "ipl_jax_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def _dry_run(py: Path, wheel: Path, root: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--python", py, "install", "--dry-run", "--no-index", "--report"]
    cmd += [root / "report.json", wheel]
    return subprocess.run([str(c) for c in cmd], cwd=root, capture_output=True, text=True, timeout=300)


def test_installing_keeps_an_accelerator_jax_that_lies_in_the_declared_range(installed, tmp_path):
    """An accelerator image ships a newer JAX than our test pins (0.11.2 on the GPU image): pip installing the
    project there must leave it in place, since the declared ranges admit it; a JAX outside the ranges is refused
    (offline here, so pip would have to fetch another and cannot)."""
    proc = _dry_run(_env_with_jax(tmp_path, "0.11.2"), installed["wheel"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [item["metadata"]["name"] for item in report["install"]] == ["ipl-jax"]  # nothing else, JAX untouched
    too_new = _dry_run(_env_with_jax(tmp_path, "0.12.0"), installed["wheel"], tmp_path)
    assert too_new.returncode != 0 and "jax<0.12" in too_new.stderr.replace(">=0.10.2,", ""), too_new.stderr[-2000:]
