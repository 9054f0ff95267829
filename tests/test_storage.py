"""The path layer (``ipl_jax.storage``) and the job's bookkeeping on object storage, against a real GCS API
emulator (fake-gcs-server, ``support.gcs_emulator``): local strings stay ``pathlib`` paths, each workdir file
round-trips through a ``gs://`` workdir as through a local one, a fresh ``Workdir`` reads the markers back, and a
location that cannot work ends in one line naming the URI before any stage starts."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import jax
import pytest

from ipl_jax import cli, storage
from ipl_jax.pipeline.paths import UsageError, output_dir
from ipl_jax.pipeline.workdir import Workdir, read_json, write_json

# ------------------------------------------------------------------------------------------------ local paths


def test_local_strings_stay_pathlib_paths(tmp_path):
    for s in ("rel/dir", "/abs/dir", str(tmp_path)):
        p = storage.as_path(s)
        assert type(p) is type(pathlib.Path(s)) and p == pathlib.Path(s)
        assert not storage.is_remote(s) and storage.absolute(s) == str(pathlib.Path(s).absolute())
    assert storage.as_path(tmp_path) is tmp_path
    assert storage.as_path("file:///abs/dir") == pathlib.Path("/abs/dir") and not storage.is_remote("file:///x")
    assert storage.is_remote("gs://b/run") and storage.scheme("gs://b/run") == "gs"
    assert storage.absolute("gs://b/run") == "gs://b/run" and str(storage.as_path("gs://b/run/x")) == "gs://b/run/x"
    storage.check_location(tmp_path / "missing")  # a local path is the probes' business


def test_scratch_dir_is_per_location_on_this_host(tmp_path, monkeypatch):
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "scratch"))
    a = storage.scratch_dir("gs://bucket/data/aitz", "screens")
    b = storage.scratch_dir("gs://other/data/aitz", "screens")
    assert a.is_dir() and b.is_dir() and a != b
    assert a.parent.parent == tmp_path / "scratch" and a.parent.name.startswith("aitz-")
    assert storage.scratch_dir("gs://bucket/data/aitz", "screens") == a


def _one_line(e: BaseException, *words: str) -> str:
    text = str(e)
    assert "\n" not in text and all(w in text for w in words), text
    return text


def test_a_scheme_nothing_handles_is_one_line():
    with pytest.raises(storage.LocationError) as e:
        storage.check_location("ftp://host/run")
    _one_line(e.value, "ftp://host/run", "no filesystem handles ftp://")


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs is installed")
def test_a_missing_client_package_is_one_line():
    with pytest.raises(storage.LocationError) as e:
        storage.check_location("s3://bucket/run")
    _one_line(e.value, "s3://bucket/run", "s3fs", "pip install")


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is None, reason="gcsfs is not installed")
def test_no_credentials_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("EPATH_USE_TF", "false")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-key.json"))
    with pytest.raises(storage.LocationError) as e:
        storage.check_location("gs://some-bucket/run")
    _one_line(e.value, "gs://some-bucket/run", "no Google Cloud credentials", "gcloud auth application-default")


# ----------------------------------------------------------------------------------------- against the emulator


def test_missing_bucket_is_one_line(gcs_bucket):
    with pytest.raises(storage.LocationError) as e:
        storage.check_location("gs://no-such-bucket-here/run")
    _one_line(e.value, "gs://no-such-bucket-here/run", "bucket no-such-bucket-here does not exist")
    storage.check_location(f"{gcs_bucket.uri}/run")  # the bucket that exists passes


def test_output_dir_probe_leaves_nothing(gcs_bucket):
    p = output_dir(f"{gcs_bucket.uri}/job", "--workdir", remote=True)
    assert str(p) == f"{gcs_bucket.uri}/job"
    assert list(storage.as_path(gcs_bucket.uri).iterdir()) == []
    write_json(storage.as_path(f"{gcs_bucket.uri}/job/an_object"), {})
    with pytest.raises(UsageError) as e:
        output_dir(f"{gcs_bucket.uri}/job/an_object", "--workdir", remote=True)
    _one_line(e.value, "--workdir", f"{gcs_bucket.uri}/job/an_object", "is an object")
    with pytest.raises(UsageError) as e:  # where a command takes local paths only
        output_dir(f"{gcs_bucket.uri}/job", "--out")
    _one_line(e.value, f"--out {gcs_bucket.uri}/job: takes a directory on this host's disk", "use a local path")


def _bookkeeping(wd: Workdir) -> dict:
    """The workdir files of a short job: config, two stages (one with metrics), results; returns the summaries."""
    write_json(wd.path("config.json"), {"seed": 3, "data": {"root": wd.path("data")}})

    def sft():
        for step in (1, 2):
            wd.log_metrics({"stage": "sft", "step": step, "loss": 1.0 / step})
        return {"steps": 2}

    out = {"data": wd.run_stage("data", lambda: {"episodes": {"train": 4}}), "sft": wd.run_stage("sft", sft)}
    write_json(wd.path("results.json"), {"rounds": [{"round": 0, "dev": 0.5}]})
    return out


def _without_times(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "peak_device_bytes")} for r in records]


def test_bookkeeping_round_trips_through_a_bucket(gcs_bucket, tmp_path):
    uri = f"{gcs_bucket.uri}/run"
    remote, local = Workdir(uri, echo=lambda _: None), Workdir(tmp_path / "run", echo=lambda _: None)
    assert remote.remote and str(remote.root) == uri and not local.remote
    summaries = {name: _bookkeeping(wd) for name, wd in (("remote", remote), ("local", local))}
    assert _without_times([summaries["remote"]["sft"]]) == [{"steps": 2}]

    for name in ("config.json", "results.json", "stages/data.done", "stages/sft.done"):
        a, b = read_json(remote.path(name)), read_json(local.path(name))
        if name == "config.json":
            assert a["data"]["root"] == f"{uri}/data" and b["data"]["root"] == str(local.path("data"))
            a, b = {"seed": a["seed"]}, {"seed": b["seed"]}
        assert _without_times([a]) == _without_times([b]), name
    for name in ("stage_log.jsonl", "metrics.jsonl"):
        lines = storage.as_path(f"{uri}/{name}").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert _without_times(records) == _without_times(
            [json.loads(x) for x in local.path(name).read_text().split("\n") if x]
        )
    assert [e["event"] for e in remote.stage_log()] == ["started", "finished", "started", "finished"]
    assert _objects(remote.root) == [
        "config.json",
        "metrics.jsonl",
        "results.json",
        "stage_log.jsonl",
        "stages/data.done",
        "stages/sft.done",
    ]


def _objects(root) -> list[str]:
    """The names under ``root``, relative to it (epath's ``rglob`` and ``walk`` do not serve gs:// here)."""
    out, todo = [], [root]
    while todo:
        for p in todo.pop().iterdir():
            if p.is_dir():
                todo.append(p)
            else:
                out.append(str(p.relative_to(root)))
    return sorted(out)


def test_a_fresh_workdir_resumes_from_the_bucket_markers(gcs_bucket):
    uri = f"{gcs_bucket.uri}/job"
    first = Workdir(uri, echo=lambda _: None)
    first.run_stage("data", lambda: {"episodes": 4})
    first.log_metrics({"step": 1})

    lines: list[str] = []
    again = Workdir(uri, echo=lines.append)  # as a restarted job (or another host) opens it

    def must_not_run():
        raise AssertionError("a finished stage ran again")

    assert again.is_done("data") and not again.is_done("sft")
    assert again.run_stage("data", must_not_run)["episodes"] == 4
    assert any("already done" in line and "stages/data.done" in line for line in lines)
    again.log_metrics({"step": 2})  # appends after what the first process wrote
    metrics = [json.loads(x) for x in storage.as_path(f"{uri}/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert [(e["stage"], e["event"]) for e in again.stage_log()] == [
        ("data", "started"),
        ("data", "finished"),
        ("data", "skipped"),
    ]


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["run", "--stop-after", "data", "--workdir", "gs://missing-bucket-41/x"],
            ("bucket missing-bucket-41 does not",),
        ),
        (["run", "--stop-after", "data", "--workdir", "ftp://host/x"], ("no filesystem handles ftp://",)),
        (["run", "--workdir", "gs://missing-bucket-41/x"], ("bucket missing-bucket-41 does not",)),
        (["sft", "--workdir", "gs://BUCKET/x"], ("takes a directory on this host's disk",)),
        (["synth", "--out", "gs://BUCKET/x", "--split", "train"], ("takes a directory on this host's disk",)),
    ],
    ids=["missing-bucket", "unknown-scheme", "missing-bucket-whole-job", "sft", "synth"],
)
def test_an_unusable_uri_ends_in_one_line(gcs_bucket, capsys, argv, words):
    argv = [a.replace("BUCKET", gcs_bucket.name) for a in argv]
    if argv[0] in ("run", "sft"):
        argv += ["--config", "synthetic:quick"]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    flag = argv[argv.index("--out") if "--out" in argv else argv.index("--workdir")]
    uri = argv[argv.index(flag) + 1]
    assert err.count("\n") == 1 and err.startswith(f"ipl-jax {argv[0]}: {flag} {uri}: "), err
    assert all(w in err for w in words), err
    assert "[data]" not in out  # before any stage
    assert list(storage.as_path(gcs_bucket.uri).iterdir()) == []


def test_orbax_checkpoint_round_trips_through_a_bucket(gcs_bucket):
    import jax.numpy as jnp
    import numpy as np

    from ipl_jax.training.checkpoint import Checkpointer

    tree = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 7, "b": {"c": jnp.full(5, 0.1, jnp.bfloat16)}}
    uri = f"{gcs_bucket.uri}/run/sft/checkpoints"
    with Checkpointer(uri, save_every=1, keep=2) as ckpt:
        assert ckpt.directory == uri
        for step in (1, 2, 3):
            ckpt.save(step, tree, data_state=f"it{step}".encode(), metadata={"epoch": step})
    again = Checkpointer(uri, save_every=1)  # as a restarted job (or another host) opens it
    try:
        assert again.all_steps() == [2, 3]
        state, data_state, meta = again.restore(jax.tree.map(jnp.zeros_like, tree))
    finally:
        again.close()
    assert data_state == b"it3" and meta == {"step": 3, "epoch": 3}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(tree)):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert sorted(p.name for p in storage.as_path(uri).iterdir()) == ["2", "3"]


def _files(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_data_stage_in_a_bucket_equals_a_local_one(gcs_bucket, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "scratch"))
    uri, local = f"{gcs_bucket.uri}/quick", tmp_path / "quick"
    for workdir in (uri, str(local), uri):  # the third: a restarted job finds the marker in the bucket
        assert cli.main(["run", "--config", "synthetic:quick", "--stop-after", "data", "--workdir", workdir]) == 0
    out = capsys.readouterr().out
    assert "uploaded" in out and out.count("[data] already done") == 1
    remote_done, local_done = read_json(f"{uri}/stages/data.done"), read_json(local / "stages" / "data.done")
    assert remote_done.pop("root") == f"{uri}/data" and local_done.pop("root") == str(local / "data")
    assert _without_times([remote_done]) == _without_times([local_done])
    assert read_json(f"{uri}/config.json") == read_json(local / "config.json")
    copied = storage.local_copy(f"{uri}/data", "data")  # this host's copy, as the stages read it
    assert copied.is_relative_to(tmp_path / "scratch")
    assert {k: v for k, v in _files(copied).items() if k != ".copied.json"} == _files(local / "data")


def test_tensorboard_events_in_a_bucket_keep_every_batch(gcs_bucket, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    from ipl_jax.viz.tensorboard_log import TensorBoardLog

    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "scratch"))
    uri = f"{gcs_bucket.uri}/job/tensorboard"
    log = TensorBoardLog(uri)
    for step in (1, 2, 3):  # one upload per batch: each replaces the object with the whole file so far
        log.sft({"step": step, "loss": 1.0 / step})
    log.close()
    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "reader"))  # another host reads the bucket
    events = EventAccumulator(str(storage.local_copy(f"{uri}/sft")), size_guidance={SCALARS: 0}).Reload()
    assert [(e.step, e.value) for e in events.Scalars("sft/loss")] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]


def test_a_data_root_in_a_bucket_reads_as_the_local_one(gcs_bucket, tmp_path, monkeypatch):
    import dataclasses

    import numpy as np

    from ipl_jax.configs.loader import load_settings
    from ipl_jax.envs.synthetic import generate_split
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
    from ipl_jax.pipeline import data_stage
    from ipl_jax.pipeline.sources import check_sources

    monkeypatch.setenv(storage.SCRATCH_ENV, str(tmp_path / "scratch"))
    s = load_settings("synthetic:quick")
    local, uri = tmp_path / "aitz", f"{gcs_bucket.uri}/datasets/aitz"
    for split in s.data.split_names():
        write_aitz_split(generate_split(split, s.data.episodes_for(split), seed=s.seed, config=s.world), local, split)
    storage.upload_tree(local, uri)
    wd = Workdir(tmp_path / "wd", echo=lambda _: None)
    read = {
        root: data_stage.load_splits(dataclasses.replace(s.data, format="aitz", root=root), wd, s.seed)
        for root in (str(local), uri, uri)
    }  # the second read of the bucket: from this host's copy
    a, b = read[str(local)], read[uri]
    assert a.keys() == b.keys() and all(len(a[k]) == len(b[k]) > 0 for k in a)
    for split in a:
        for x, y in zip(a[split], b[split]):
            assert x.episode_id == y.episode_id and len(x.steps) == len(y.steps)
            for p, q in zip(x.steps, y.steps):
                assert (p.instruction, p.action, p.coat) == (q.instruction, q.action, q.coat)
                assert np.array_equal(np.asarray(p.load_image()), np.asarray(q.load_image()))
    assert str(b["train"][0].steps[0].image).startswith(str(tmp_path / "scratch"))  # read on this host's disk

    bad = dataclasses.replace(s.data, format="arrayrecord", root="gs://no-such-bucket-41/aitz")
    with pytest.raises(UsageError) as e:
        check_sources(bad, s.model)
    _one_line(e.value, "config.data.root=gs://no-such-bucket-41/aitz: bucket no-such-bucket-41 does not exist")
