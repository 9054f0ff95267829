"""``ipl-jax check-parity`` on a tiny checkpoint written by transformers itself."""

from __future__ import annotations

import json

import pytest
from support.hf_models import save_tiny

import ipl_jax.model.parity as parity_module
from ipl_jax.cli import main as cli_main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("parity"), seed=21, tie=True, heads=4, kv_heads=1)[0]


def _run(capsys, argv):
    rc = cli_main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    return rc, (json.loads(out[-1]) if out else None)


@pytest.mark.e2e
def test_check_parity_passes_and_reports(checkpoint, capsys):
    rc, res = _run(capsys, ["check-parity", "--model", checkpoint])
    assert rc == 0, res
    assert res["ok"] is True and res["tolerance"] == 1e-4
    assert 0 <= res["max_abs_logit_diff"] <= 1e-4
    assert res["logit_std"] >= 0.5


@pytest.mark.e2e
def test_check_parity_fails_on_a_mismatch(checkpoint, capsys, monkeypatch):
    real = parity_module.forward_inputs
    monkeypatch.setattr(parity_module, "forward_inputs", lambda p, c, i: real(p, c, i) + 1e-3)
    rc, res = _run(capsys, ["check-parity", "--model", checkpoint, "--tolerance", "5e-4"])
    assert rc == 1 and res["ok"] is False and res["max_abs_logit_diff"] > 5e-4


def test_check_parity_unreadable_model(tmp_path, capsys):
    assert cli_main(["check-parity", "--model", str(tmp_path / "missing")]) == 2
