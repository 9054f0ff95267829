"""Bad input around packed data: truncated, foreign or missing shards, metadata of another version or pack,
records that do not decode (named and fatal, or counted and skipped), a packed directory read under the wrong
format, and ``ipl-jax pack-data``'s one-line errors and exit statuses."""

import json
import shutil
from pathlib import Path

import pytest
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
from support.published_fixtures import write_aitz, write_amex

from ipl_jax.cli.pack_data import main as pack_main
from ipl_jax.data.datasets import load_dataset
from ipl_jax.data.packed.layout import METADATA_FILE, WRITER_OPTIONS, read_metadata
from ipl_jax.data.packed.reader import load_packed, load_packed_with_report
from ipl_jax.data.packed.writer import pack_dataset
from ipl_jax.data.records import DataError


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_aitz(tmp_path_factory.mktemp("aitz") / "src")


@pytest.fixture()
def packed(source, tmp_path):
    pack_dataset("aitz", source, tmp_path / "packed", shards=2)
    return tmp_path / "packed"


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def _shard(packed: Path, split="train", k=0) -> Path:
    return packed / read_metadata(packed)["splits"][split]["files"][k]["name"]


def _rewrite(path: Path, edit) -> None:
    """Rewrite an ArrayRecord shard with ``edit(records) -> records``."""
    reader = ArrayRecordReader(str(path))
    records = list(reader.read_all())
    reader.close()
    writer = ArrayRecordWriter(str(path), WRITER_OPTIONS)
    for r in edit(records):
        writer.write(r)
    writer.close()


def test_truncated_and_foreign_shards_are_named(packed):
    shard = _shard(packed)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        load_dataset(packed, "arrayrecord", "train")
    assert _one_line(err).startswith(f"{shard}: not a readable ArrayRecord file")
    shard.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 70000)  # another kind of file
    with pytest.raises(ValueError, match="not a readable ArrayRecord file"):
        load_packed(packed, "train")
    shard.unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_packed(packed, "train")
    assert _one_line(err).startswith(f"{shard}: shard of split 'train' listed in {METADATA_FILE} is missing")


def test_metadata_of_another_version_or_kind(packed):
    path = packed / METADATA_FILE
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "version": 2}))
    with pytest.raises(ValueError) as err:
        load_packed(packed, "train")
    assert _one_line(err) == (
        f"{path}: packed with version 2; this ipl-jax reads version 1 (repack the source with ipl-jax pack-data)"
    )
    path.write_text(json.dumps({**meta, "format": "something-else"}))
    with pytest.raises(ValueError, match="not an ipl-jax ArrayRecord metadata file"):
        read_metadata(packed)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"{path}: not valid JSON"):
        read_metadata(packed)


def test_a_shard_from_another_pack_is_caught_by_its_count(packed, tmp_path, source):
    pack_dataset("aitz", source, tmp_path / "one", shards=1)
    shutil.copy(_shard(tmp_path / "one"), _shard(packed))  # 7 records where 4 are listed
    with pytest.raises(ValueError) as err:
        load_packed(packed, "train")
    assert "holds 7 records but" in _one_line(err) and str(_shard(packed)) in str(err.value)


def test_undecodable_record_is_named_or_skipped(packed):
    shard = _shard(packed)
    _rewrite(shard, lambda recs: [recs[0], b"not a step record at all", *recs[2:]])
    with pytest.raises(DataError) as err:
        load_packed(packed, "train")
    assert (err.value.file, err.value.record, err.value.field) == (str(shard), 1, "<magic>")
    episodes, skipped = load_packed_with_report(packed, "train", skip_bad=True)
    assert len(skipped) == 1 and skipped[0].record == 1
    assert sum(len(e.steps) for e in episodes) == 7 - 1
    assert [s.step_id for s in episodes[0].steps] == [0, 2, 3]

    # a record of another encoding version, and a header that is not JSON
    _rewrite(shard, lambda recs: [recs[0][:7] + bytes([9]) + recs[0][8:], *recs[1:]])
    with pytest.raises(DataError, match="record version 9; this ipl-jax reads version 1"):
        load_packed(packed, "train")
    _rewrite(shard, lambda recs: [recs[0][:7] + bytes([1]) + recs[0][8:12] + b"!" + recs[0][13:], *recs[1:]])
    with pytest.raises(DataError) as err:
        load_packed(packed, "train")
    assert err.value.field == "<header>" and err.value.record == 0


def test_packed_directory_under_the_wrong_format_or_split(packed, tmp_path):
    with pytest.raises(ValueError, match="holds packed aitz data, not amex; read it as format aitz or arrayrecord"):
        load_dataset(packed, "amex", None)
    with pytest.raises(ValueError, match=r"no split 'dev' in this packed aitz data \(have test, train\)"):
        load_dataset(packed, "arrayrecord", "dev")
    with pytest.raises(FileNotFoundError, match="not a packed dataset"):
        load_dataset(tmp_path, "arrayrecord", "train")


# ---------------------------------------------------------------------------------------------- the command


def _run(argv, capsys):
    status = pack_main(argv)
    return status, capsys.readouterr()


def test_pack_data_usage_errors_exit_2(source, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    cases = [
        (["--format", "rico", "--data", str(source), "--out", str(tmp_path / "o")], "argument --format"),
        (["--format", "aitz", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "no such directory"),
        (["--format", "aitz", "--data", str(source), "--out", str(tmp_path / "full")], "is not empty"),
        (["--format", "aitz", "--data", str(source), "--out", str(tmp_path / "o"), "--shards", "0"], "must be >= 1"),
        (
            ["--format", "aitz", "--data", str(source), "--out", str(tmp_path / "o"), "--splits", "dev"],
            "no split dev in this aitz data (found: test, train",
        ),
        (["--format", "amex", "--data", str(source), "--out", str(tmp_path / "o")], "no split (none found)"),
    ]
    for argv, message in cases:
        status, out = _run(argv, capsys)
        assert status == 2 and message in out.err and out.err.count("\n") == 1, (argv, out.err)
    assert not (tmp_path / "o").exists()  # nothing written before the checks


def test_pack_data_malformed_source_record(tmp_path, capsys):
    root = write_amex(tmp_path / "amex")
    anno = root / "instruction_anno" / "ep_a.json"
    data = json.loads(anno.read_text())
    data["steps"][1]["touch_coord"] = [1, 2, 3]
    anno.write_text(json.dumps(data))
    status, out = _run(["--format", "amex", "--data", str(root), "--out", str(tmp_path / "o")], capsys)
    assert status == 1 and str(anno) in out.err and "touch_coord" in out.err
    assert not (tmp_path / "o" / METADATA_FILE).exists()

    status, out = _run(["--format", "amex", "--data", str(root), "--out", str(tmp_path / "o"), "--skip-bad"], capsys)
    assert status == 0 and "skipped 1 malformed record" in out.err
    assert "all: 2 episodes, 6 steps in 1 shards, 1 malformed records skipped" in out.out
    meta = read_metadata(tmp_path / "o")
    assert meta["splits"]["all"]["skipped"] == 1 and meta["splits"]["all"]["steps"] == 6
    # the pack is replaced in place by a later run
    status, out = _run(
        ["--format", "amex", "--data", str(root), "--out", str(tmp_path / "o"), "--skip-bad", "--shards", "2"], capsys
    )
    assert status == 0 and sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "all.array_record-00000-of-00002",
        "all.array_record-00001-of-00002",
        METADATA_FILE,
    ]
