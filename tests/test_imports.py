"""Imports flow down (docs/layout.md): no library module imports the job's settings, the memory planner, the
pipeline or a command, the planner imports neither the pipeline nor a command, and the names a library accepts
are its own, so that importing the DPO loss, the T-DPO step or the
optimizer loads neither the job's settings nor the synthetic world (or PIL), and importing the job's settings
loads neither JAX nor the world.

Import sets are read in fresh interpreters (``sys.executable -c``): this process has imported everything.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import ipl_jax

PACKAGE = Path(ipl_jax.__file__).resolve().parent
LOWER = ("model", "coat", "data", "envs", "sampling", "preference", "training", "rl", "eval")
HIGHER = ("ipl_jax.pipeline", "ipl_jax.cli", "ipl_jax.settings", "ipl_jax.planning")
PLANNER = ("planning",)  # reads the job's settings; the job and the commands import it
ABOVE_PLANNER = ("ipl_jax.pipeline", "ipl_jax.cli")
NOT_LOADED = ("PIL", "ipl_jax.envs.synthetic", "ipl_jax.settings", "ipl_jax.pipeline", "ipl_jax.cli")


def _imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy and type-checking imports too), relative ones resolved;
    ``from a import b`` names both ``a`` and ``a.b``."""
    package = ".".join(("ipl_jax", *path.relative_to(PACKAGE).parent.parts))
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def _loaded_after(modules: list[str], watch: tuple[str, ...]) -> dict[str, list[str]]:
    """For each of ``modules``, imported in turn in a fresh interpreter: the ``watch`` modules loaded by then."""
    code = (
        "import importlib, json, sys\n"
        f"watch = {list(watch)!r}\n"
        "out = {}\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "    out[m] = [w for w in watch if w in sys.modules]\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def _files(layers: tuple[str, ...]) -> list[Path]:
    return sorted(p for layer in layers for p in (PACKAGE / layer).rglob("*.py"))


def _upward(files: list[Path], higher: tuple[str, ...]) -> dict[str, list[str]]:
    """Of ``files``, those that import a module of ``higher``, with those modules."""
    wrong = {}
    for path in files:
        rel = path.relative_to(PACKAGE).as_posix()
        up = sorted(n for n in _imported(path) if any(n == h or n.startswith(h + ".") for h in higher))
        if up:
            wrong[rel] = up
    return wrong


def test_lower_layers_import_no_settings_planner_pipeline_or_command():
    files = _files(LOWER)
    assert len(files) > 50  # the walk found the package
    wrong = _upward(files, HIGHER)
    assert not wrong, f"lower layers import higher ones: {wrong}"


def test_planner_imports_no_pipeline_or_command():
    files = _files(PLANNER)
    assert len(files) > 3  # the walk found the planner
    wrong = _upward(files, ABOVE_PLANNER)
    assert not wrong, f"the planner imports higher layers: {wrong}"


def test_losses_step_and_optimizer_load_no_settings_or_world():
    """The DPO loss, the T-DPO step and the optimizer (each imported in turn: what one loads, the next keeps)."""
    modules = ["ipl_jax.preference.losses", "ipl_jax.preference.tdpo", "ipl_jax.training.optimizer"]
    assert _loaded_after(modules, NOT_LOADED) == {m: [] for m in modules}


def test_settings_load_no_jax_or_world():
    """The job's settings read the data's name tables and the world's config without the readers, the world, its
    renderer or JAX (a library's names are imported when a section is made), so commands start fast."""
    watch = ("jax", "PIL", "ipl_jax.data.records", "ipl_jax.envs.synthetic.world", "ipl_jax.envs.synthetic.dataset")
    assert _loaded_after(["ipl_jax.settings"], watch) == {"ipl_jax.settings": []}
