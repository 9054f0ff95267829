"""The code passes the ruff lint and format configuration in pyproject.toml, and stays readable in pieces: no function
over 80 lines, no module over 450."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it comes with the test extra)")
    return [exe]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff(args):
    out = subprocess.run(_ruff() + args, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]


MAX_FUNCTION_LINES, MAX_FILE_LINES = 80, 450
SOURCES = ("ipl_jax", "configs", "tools")  # what the package ships and the scripts it runs; tests are not counted


def _sources():
    return sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py"))


def test_no_function_is_longer_than_80_lines():
    """A function's lines from its ``def`` to its last line, docstring included."""
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split by what each part does:\n" + "\n".join(long)


def test_no_module_is_longer_than_450_lines():
    sizes = {path: len(path.read_text().splitlines()) for path in _sources()}
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p, n in sizes.items() if n > MAX_FILE_LINES]
    assert not long, "\n".join(long)
