"""Each setting is declared once: in its section dataclass, with its type, its default and a one-line doc; the
config files only override (``configs/loader.default_config``). A library that owns a section (``rl.sections``)
declares it; its config holds it."""

import ast
from pathlib import Path

from ipl_jax.configs.loader import default_config, load_config
from ipl_jax.settings import Settings

PACKAGE = Path(__file__).resolve().parent.parent / "ipl_jax"
# the job's sections, and the sections a library owns (``rl/sections.py``)
SECTION_FILES = sorted((PACKAGE / "settings").glob("*.py")) + sorted(PACKAGE.glob("*/sections.py"))


def test_every_field_has_a_default_and_a_doc():
    undocumented, fields = [], 0
    for path in SECTION_FILES:
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(cls, ast.ClassDef) or not cls.bases:  # a section (a Section subclass)
                continue
            body = cls.body
            for i, node in enumerate(body):
                if not isinstance(node, ast.AnnAssign) or ast.unparse(node.annotation).startswith("ClassVar"):
                    continue
                fields += 1
                name = f"{cls.name}.{node.target.id}"
                assert node.value is not None, f"{name} has no default"
                section = ast.unparse(node.annotation).endswith("Settings")  # documented in its own class
                doc = body[i + 1] if i + 1 < len(body) else None
                if not section and not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
                    undocumented.append(name)
    assert fields > 150 and not undocumented, undocumented


def test_the_defaults_are_the_full_synthetic_job_less_its_world():
    defaults, full = default_config().to_dict(), load_config("synthetic:full").to_dict()
    assert {k: v for k, v in defaults.items() if k != "world"} == {k: v for k, v in full.items() if k != "world"}
    assert Settings.from_dict(defaults).to_dict() == Settings().to_dict()
