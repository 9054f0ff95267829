"""The commands besides ``run`` with their inputs and outputs in a bucket of the GCS emulator
(``support.gcs_emulator``): ``ipl-jax eval``, ``score``, ``sample``, ``export`` and ``plan --workdir`` given
``gs://`` URIs write to the bucket what they write to a local disk given local paths (inputs read from this host's
copy of them, in its scratch). Inputs: a tiny checkpoint (transformers-written, a trained BPE tokenizer) and a
synthetic split in the AITZ format, made locally and uploaded."""

from __future__ import annotations

import json

import pytest
from support.published_fixtures import tiny_checkpoint_and_data

from ipl_jax import cli, storage

TURN_TOKENS = ["--max-turn-tokens", "8", "6", "6", "8"]


@pytest.fixture(scope="module")
def local_inputs(tmp_path_factory):
    """(checkpoint, data root) on this host's disk."""
    return tiny_checkpoint_and_data(tmp_path_factory.mktemp("inputs"))


@pytest.fixture
def inputs(local_inputs, gcs_bucket, tmp_path, monkeypatch):
    """{name: (local path, URI)} of the inputs, uploaded to the test's bucket; this host's scratch in tmp_path."""
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "scratch"))
    ckpt, data = local_inputs
    out = {}
    for name, local in (("model", ckpt), ("data", data)):
        storage.upload_tree(local, f"{gcs_bucket.uri}/in/{name}")
        out[name] = (str(local), f"{gcs_bucket.uri}/in/{name}")
    return out


def _both(argv_of, tmp_path, bucket) -> tuple[str, str]:
    """Run the command ``argv_of(inputs_index, out_root)`` on the local paths (outputs under tmp_path/local), then
    on the URIs (outputs under BUCKET/out); returns the two output roots."""
    local, remote = str(tmp_path / "local"), f"{bucket.uri}/out"
    assert cli.main(argv_of(0, local)) == 0
    assert cli.main(argv_of(1, remote)) == 0
    return local, remote


def _text(root: str, name: str) -> str:
    return storage.as_path(f"{root}/{name}").read_text()


@pytest.mark.e2e
def test_eval_and_score_read_and_write_a_bucket(inputs, gcs_bucket, tmp_path):
    def evaluate(i, out):
        model, data = inputs["model"][i], inputs["data"][i]
        outputs = ["--json", f"{out}/table.json", "--predictions", f"{out}/preds.jsonl"]
        return ["eval", "--model", model, "--data", data, "--format", "aitz", "--steps", "3", *TURN_TOKENS, *outputs]

    local, remote = _both(evaluate, tmp_path, gcs_bucket)
    for name in ("table.json", "preds.jsonl"):
        assert _text(remote, name) == _text(local, name), name

    def score(i, out):
        src = (local, remote)[i]
        data = inputs["data"][i]
        return ["score", "--data", data, "--format", "aitz", "--predictions", f"{src}/preds.jsonl", "--json"] + [
            f"{out}/rescored.json"
        ]

    local, remote = _both(score, tmp_path, gcs_bucket)
    assert json.loads(_text(remote, "rescored.json")) == json.loads(_text(local, "rescored.json"))


@pytest.mark.e2e
def test_sample_reads_and_writes_a_bucket(inputs, gcs_bucket, tmp_path):
    def sample(i, out):
        model, data = inputs["model"][i], inputs["data"][i]
        flags = ["--branching", "2", "1", "2", "1", "--batch-size", "2", "--temperature", "1.0", "--steps", "2"]
        files = ["--out", f"{out}/trees.jsonl", "--html", f"{out}/trees.html"]
        return ["sample", "--model", model, "--data", data, "--split", "test", *TURN_TOKENS, *flags, *files]

    local, remote = _both(sample, tmp_path, gcs_bucket)
    assert _text(remote, "trees.jsonl") == _text(local, "trees.jsonl")
    assert _text(remote, "trees.html") == _text(local, "trees.html")


def test_export_reads_and_writes_a_bucket(inputs, gcs_bucket, tmp_path, capsys):
    def export(i, out):
        return ["export", "--model", inputs["model"][i], "--out", f"{out}/export", "--dtype", "bfloat16"]

    local, remote = _both(export, tmp_path, gcs_bucket)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed[0]["copied"] == printed[1]["copied"] != []
    files = lambda root: {p.name: p.read_bytes() for p in storage.as_path(root).iterdir()}
    assert files(storage.local_dir(f"{remote}/export")) == files(f"{local}/export")


def test_export_reads_orbax_params_from_a_bucket(inputs, gcs_bucket, tmp_path):
    """``--orbax-params`` in a bucket: Orbax reads the URI itself (no copy); the export equals the local one's."""
    import orbax.checkpoint as ocp

    from ipl_jax.model.weights import load_params

    params, _ = load_params(inputs["model"][0])
    for where in (str(tmp_path / "params"), f"{gcs_bucket.uri}/params"):
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(where, params)

    def export(i, out):
        src = (str(tmp_path / "params"), f"{gcs_bucket.uri}/params")[i]
        return ["export", "--model", inputs["model"][i], "--orbax-params", src, "--out", f"{out}/export"]

    local, remote = _both(export, tmp_path, gcs_bucket)
    files = lambda root: {p.name: p.read_bytes() for p in storage.as_path(root).iterdir()}
    assert files(storage.local_dir(f"{remote}/export")) == files(f"{local}/export")
    assert not list((tmp_path / "scratch").glob("params-*"))  # read by Orbax from the bucket, not copied


def _without_compile_times(obj):
    if isinstance(obj, dict):
        return {k: _without_compile_times(v) for k, v in obj.items() if not k.startswith("compile")}
    return obj


@pytest.mark.e2e
def test_plan_reads_a_workdir_in_a_bucket(gcs_bucket, tmp_path, capsys):
    fitted = json.dumps({"changed": {"ipl.text_buckets": [640, 704]}})
    for wd in (tmp_path / "wd", f"{gcs_bucket.uri}/wd"):
        storage.write_text(f"{wd}/stages/buckets.done", fitted)

    def plan(i, out):
        wd = (str(tmp_path / "wd"), f"{gcs_bucket.uri}/wd")[i]
        return [
            "plan",
            "--config",
            "synthetic:quick",
            "--programs",
            "tdpo",
            "--workdir",
            wd,
            "--json",
            f"{out}/plan.json",
        ]

    local, remote = _both(plan, tmp_path, gcs_bucket)
    assert _without_compile_times(json.loads(_text(remote, "plan.json"))) == _without_compile_times(
        json.loads(_text(local, "plan.json"))
    )
    assert "704" in _text(remote, "plan.json")


@pytest.mark.parametrize(
    "argv, flag, words",
    [
        (
            ["score", "--data", "LOCAL", "--format", "aitz", "--predictions", "BUCKET/none.jsonl"],
            "--predictions",
            "no such object",
        ),
        (["eval", "--model", "BUCKET/none", "--data", "LOCAL", "--format", "aitz"], "--model", "no such directory"),
        (
            ["eval", "--model", "gs://missing-bucket-41/m", "--data", "LOCAL", "--format", "aitz"],
            "--model",
            "does not exist",
        ),
        (["export", "--model", "LOCAL", "--out", "gs://missing-bucket-41/e"], "--out", "does not exist"),
        (
            ["sample", "--model", "LOCAL", "--data", "LOCAL", "--out", "ftp://h/t.jsonl"],
            "--out",
            "no filesystem handles",
        ),
        (["plan", "--config", "synthetic:quick", "--workdir", "BUCKET/wd"], "--workdir", "no finished buckets stage"),
    ],
    ids=[
        "score-missing-object",
        "eval-missing-model",
        "eval-missing-bucket",
        "export-missing-bucket",
        "sample-scheme",
        "plan-no-stage",
    ],
)
def test_an_unusable_uri_ends_in_one_line(gcs_bucket, tmp_path, capsys, argv, flag, words):
    argv = [a.replace("BUCKET", gcs_bucket.uri).replace("LOCAL", str(tmp_path)) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    uri = argv[argv.index(flag) + 1]
    assert err.count("\n") == 1 and err.startswith(f"ipl-jax {argv[0]}: {flag} "), err
    assert uri in err and words in err, err
