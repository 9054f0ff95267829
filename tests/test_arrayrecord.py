"""Packed ArrayRecord datasets: every reader's fixture packed and read back equals the direct read, record for
record; packing is byte-deterministic; ``score`` gives identical tables from both sources; two processes
read every record exactly once; a Grain iterator over packed steps resumes from an Orbax checkpoint at the
same next batch."""

import dataclasses
import filecmp
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.published_fixtures import WRITERS
from support.trees import assert_trees_equal

from ipl_jax.coat.actions import Action
from ipl_jax.coat.tables import score_episodes
from ipl_jax.data.datasets import load_dataset, scoring_format
from ipl_jax.data.packed.encoding import MAGIC, RECORD_VERSION, encode_step, split_record, step_from_header
from ipl_jax.data.packed.layout import METADATA_FILE, is_packed, read_metadata
from ipl_jax.data.packed.reader import open_split
from ipl_jax.data.packed.writer import pack_dataset, shard_of_episodes
from ipl_jax.data.pipeline import iterator_state, make_dataset, make_iterator, restore_iterator

READ_AS = {"aitz": "aitz", "amex": "amex", "androidcontrol": "androidcontrol", "synthetic": "aitz"}


@pytest.fixture(scope="module")
def packed_sets(tmp_path_factory):
    """format -> (source root, packed dir) for every format, packed with 2 shards per split."""
    out = {}
    for fmt, write in WRITERS.items():
        base = tmp_path_factory.mktemp(fmt)
        root = write(base / "src")
        pack_dataset(fmt, root, base / "packed", shards=2)
        out[fmt] = (root, base / "packed")
    return out


def _portable_meta(meta: dict, root: Path) -> dict:
    """A direct read's meta as packing stores it: ``file`` relative to the root, tuples as JSON lists."""
    meta = dict(meta)
    if "file" in meta:
        meta["file"] = Path(meta["file"]).resolve().relative_to(root.resolve()).as_posix()
    return json.loads(json.dumps(meta))


def _image_bytes(step) -> bytes:
    return Path(step.image).read_bytes() if isinstance(step.image, str) else step.image.encoded()


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_round_trip_equals_the_direct_read(packed_sets, fmt):
    root, packed = packed_sets[fmt]
    meta = read_metadata(packed)
    assert meta["dataset"] == fmt and meta["scoring_format"] == scoring_format(READ_AS[fmt], root)
    for split, info in meta["splits"].items():
        direct = load_dataset(root, READ_AS[fmt], split)
        back = load_dataset(packed, "arrayrecord", split)
        assert info["episodes"] == len(direct) > 0 and info["steps"] == sum(len(e.steps) for e in direct)
        assert [e.episode_id for e in back] == [e.episode_id for e in direct]
        for d_ep, b_ep in zip(direct, back):
            assert b_ep.instruction == d_ep.instruction
            assert b_ep.meta == _portable_meta(d_ep.meta, root)
            assert len(b_ep.steps) == len(d_ep.steps)
            for d, b in zip(d_ep.steps, b_ep.steps):
                # every field (action, elements, history, CoaT, sizes, ids) equal; images compared as bytes
                assert dataclasses.replace(b, image=None) == dataclasses.replace(d, image=None)
                assert b.meta == _portable_meta(d.meta, root)
                assert _image_bytes(b) == Path(d.image).read_bytes()
        # auto-detection: the published format's name on a packed directory reads the same steps
        again = load_dataset(packed, READ_AS[fmt], "all" if fmt == "amex" else split)
        assert [s for e in again for s in e.steps] == [s for e in back for s in e.steps]
    assert np.asarray(back[0].steps[0].load_image()).shape[2] == 3


def test_packing_is_byte_deterministic_wherever_the_source_lies(packed_sets, tmp_path):
    root, packed = packed_sets["aitz"]
    moved = shutil.copytree(root, tmp_path / "elsewhere" / "aitz")
    pack_dataset("aitz", moved, tmp_path / "again", shards=2)
    names = sorted(p.name for p in packed.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    assert len(names) == 1 + 2 * 2  # metadata + 2 shards x (train, test)
    match, mismatch, errors = filecmp.cmpfiles(packed, tmp_path / "again", names, shallow=False)
    assert mismatch == [] and errors == [] and len(match) == len(names)
    # the metadata's digests describe the files
    meta = read_metadata(packed)
    for f in meta["splits"]["train"]["files"]:
        assert hashlib.sha256((packed / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    # a changed source changes the source hash
    (moved / "train" / "extra.txt").write_text("x")
    pack_dataset("aitz", moved, tmp_path / "changed", shards=2)
    assert read_metadata(tmp_path / "changed")["source_sha256"] != meta["source_sha256"]


def test_record_encoding_layout_and_exact_floats(packed_sets):
    root, _ = packed_sets["aitz"]
    ep = load_dataset(root, "aitz", "train")[0]
    step = ep.steps[0]
    png = Path(step.image).read_bytes()
    record = encode_step(step, ep, png)
    assert record[:7] == MAGIC and record[7] == RECORD_VERSION
    n = int.from_bytes(record[8:12], "little")
    header = json.loads(record[12 : 12 + n])
    assert record[12 + n :] == png and header["image_format"] == "png"
    assert list(header) == sorted(header)  # canonical: sorted keys
    header, image = split_record(record, ("mem", 0))
    assert bytes(image) == png
    decoded, _ = step_from_header(header, png, ("mem", 0))
    assert decoded.action.point == step.action.point and decoded.elements == step.elements  # bit-exact floats
    assert decoded.history == step.history and decoded.coat == step.coat


def test_whole_episodes_per_shard():
    assert shard_of_episodes([4, 3, 3], 2) == [0, 0, 1]
    assert shard_of_episodes([1, 1, 1, 1], 4) == [0, 1, 2, 3]
    assert shard_of_episodes([5], 3) == [0]  # the other shards stay empty


@pytest.mark.parametrize("fmt", ["aitz", "amex"])
def test_score_identical_from_both_sources(packed_sets, fmt, tmp_path):
    from ipl_jax.cli.score import main as score_main

    root, packed = packed_sets[fmt]
    split = "all" if fmt == "amex" else "train"
    direct = load_dataset(root, fmt, split)
    steps = [s for e in direct for s in e.steps]
    # a mix of exact, wrong-type and missing predictions
    preds = {}
    for i, s in enumerate(steps):
        if i % 3 == 0:
            preds[(s.episode_id, s.step_id)] = s.action
        elif i % 3 == 1:
            preds[(s.episode_id, s.step_id)] = Action(type="press", button="back")
    table_direct = score_episodes(direct, preds, fmt)
    table_packed = score_episodes(
        load_dataset(packed, "arrayrecord", split), preds, scoring_format("arrayrecord", packed)
    )
    assert table_packed == table_direct and 0 < table_direct["step_acc"] < 1

    lines = [json.dumps({"episode_id": k[0], "step_id": k[1], "prediction": a.to_json()}) for k, a in preds.items()]
    (tmp_path / "preds.jsonl").write_text("\n".join(lines) + "\n")
    for name, data in (("direct", root), ("packed", packed)):
        assert (
            score_main(
                [
                    "--data",
                    str(data),
                    "--format",
                    fmt,
                    "--split",
                    split,
                    "--predictions",
                    str(tmp_path / "preds.jsonl"),
                    "--json",
                    str(tmp_path / f"{name}.json"),
                ]
            )
            == 0
        )
    assert json.loads((tmp_path / "packed.json").read_text()) == json.loads((tmp_path / "direct.json").read_text())


def _ids(source) -> list[tuple[str, int]]:
    return [(s.episode_id, s.step_id) for s in (source[i] for i in range(len(source)))]


def test_two_processes_read_every_record_exactly_once(packed_sets, tmp_path):
    root, _ = packed_sets["synthetic"]
    pack_dataset("synthetic", root, tmp_path / "p4", shards=4)
    everything = _ids(open_split(tmp_path / "p4", "train", process_index=0, process_count=1))
    shares = [open_split(tmp_path / "p4", "train", process_index=p, process_count=2) for p in (0, 1)]
    assert [len(s.paths) for s in shares] == [2, 2] and set(shares[0].paths).isdisjoint(shares[1].paths)
    seen = _ids(shares[0]) + _ids(shares[1])
    assert sorted(seen) == sorted(everything) and len(set(seen)) == len(everything) == 20
    # through the shuffled Grain pipeline, one epoch per process: still every record once
    batches = []
    for share in shares:
        ds = make_dataset(
            share, lambda s: np.array([int(s.episode_id), s.step_id]), batch_size=1, seed=3, drop_remainder=False
        )
        batches += [tuple(b[0]) for b in make_iterator(ds, num_threads=2)]
    assert sorted(batches) == sorted((int(e), s) for e, s in everything)
    with pytest.raises(ValueError, match=r"4 shard files cannot be divided among 3 processes.*--shards"):
        open_split(tmp_path / "p4", "train", process_index=0, process_count=3)


def test_iterator_resumes_from_the_orbax_checkpoint_at_the_same_batch(packed_sets, tmp_path):
    from ipl_jax.training.checkpoint import Checkpointer

    _, packed = packed_sets["synthetic"]
    source = open_split(packed, "train", process_index=0, process_count=1)

    def example(step):  # reads the screenshot through the record, as an SFT example does
        pixels = np.asarray(step.load_image(), np.float32)
        return {"ids": np.array([int(step.episode_id), step.step_id]), "mean": pixels.mean(axis=(0, 1))}

    def pipeline():
        ds = make_dataset(source, example, batch_size=3, seed=11, num_epochs=None)
        return make_iterator(ds, num_threads=2, prefetch_buffer_size=2)

    straight = pipeline()
    expected = [next(straight) for _ in range(9)]  # 27 examples: crosses an epoch of 20
    first = pipeline()
    for _ in range(4):
        next(first)
    state = {"w": np.arange(3, dtype=np.float32)}
    with Checkpointer(tmp_path / "ck", save_every=1, async_save=False) as ck:
        ck.save(4, state, data_state=iterator_state(first))
    with Checkpointer(tmp_path / "ck", save_every=1) as ck:
        _, data_state, _ = ck.restore(state)
    resumed = restore_iterator(pipeline(), data_state)
    assert_trees_equal([next(resumed) for _ in expected[4:]], expected[4:])
    assert not np.array_equal(expected[4]["ids"], expected[5]["ids"])


def test_is_packed_and_metadata_counts(packed_sets):
    root, packed = packed_sets["androidcontrol"]
    assert is_packed(packed) and not is_packed(root) and not is_packed(root / METADATA_FILE)
    meta = read_metadata(packed)
    assert sorted(meta["splits"]) == ["test", "train", "validation"]
    assert {k: v["steps"] for k, v in meta["splits"].items()} == {"train": 3, "validation": 4, "test": 2}
    assert all(len(v["files"]) == 2 and v["skipped"] == 0 for v in meta["splits"].values())


def test_synthetic_job_stores_its_data_as_arrayrecord(tmp_path):
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.data.datasets import scoring_format
    from ipl_jax.pipeline import data_stage
    from ipl_jax.pipeline.workdir import Workdir

    splits = {}
    for store in ("aitz", "arrayrecord"):
        settings = load_settings("synthetic:full").replace(
            {
                "data.train_episodes": 3,
                "data.dev_episodes": 1,
                "data.test_episodes": 1,
                "data.test_splits": ("test",),
                "data.store": store,
                "data.shards": 2,
            }
        )
        wd = Workdir(tmp_path / store, echo=lambda *_: None)
        data_stage.write_synthetic(settings, wd)
        splits[store] = data_stage.load_splits(settings.data, wd, settings.seed)
        assert scoring_format(settings.data.format, settings.data.root) == "aitz"
    assert is_packed(tmp_path / "arrayrecord" / "data") and not (tmp_path / "arrayrecord" / "data_aitz").exists()
    assert sorted(splits["aitz"]) == sorted(splits["arrayrecord"]) == ["dev", "test", "train"]
    for name, episodes in splits["aitz"].items():
        packed_steps = [s for e in splits["arrayrecord"][name] for s in e.steps]
        direct_steps = [s for e in episodes for s in e.steps]
        assert [dataclasses.replace(s, image=None) for s in packed_steps] == [
            dataclasses.replace(s, image=None) for s in direct_steps
        ] and direct_steps
        assert packed_steps[0].image.encoded() == Path(direct_steps[0].image).read_bytes()
