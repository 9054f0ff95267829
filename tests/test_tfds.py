"""TensorFlow Datasets: the ipl_synthetic and ipl_aitz builders (array_record files), read back through
``tfds.data_source`` as ``data.format = "tfds:NAME"`` equal to the direct AITZ read and to the packed read of the
same files; reading needs no TensorFlow; unknown or unprepared names are one-line errors."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.published_fixtures import write_aitz

tfds = pytest.importorskip("tensorflow_datasets")

import ipl_jax.data.tfds  # noqa: E402  (registers ipl_aitz)
import ipl_jax.envs.synthetic.tfds_builder  # noqa: E402,F401  (registers ipl_synthetic)
from ipl_jax.data.aitz import load_aitz  # noqa: E402
from ipl_jax.data.datasets import load_dataset, scoring_format  # noqa: E402
from ipl_jax.data.packed.writer import pack_dataset  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(data_dir, the AITZ folder the synthetic builder read, the AITZ fixture root) with ipl_synthetic/tiny and
    ipl_aitz prepared."""
    data_dir = tmp_path_factory.mktemp("tfds")
    tfds.builder("ipl_synthetic/tiny", data_dir=data_dir, file_format="array_record").download_and_prepare()
    aitz_root = write_aitz(tmp_path_factory.mktemp("aitz") / "src")
    tfds.builder("ipl_aitz", data_dir=data_dir, file_format="array_record").download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=str(aitz_root))
    )
    (synthetic_aitz,) = (data_dir / "downloads").glob("ipl_synthetic_tiny_*")
    return data_dir, synthetic_aitz, aitz_root


def _same_steps(a_eps, b_eps):
    assert [e.episode_id for e in a_eps] == [e.episode_id for e in b_eps] and a_eps
    for a_ep, b_ep in zip(a_eps, b_eps):
        assert a_ep.instruction == b_ep.instruction and a_ep.meta == b_ep.meta
        for a, b in zip(a_ep.steps, b_ep.steps, strict=True):
            assert dataclasses.replace(a, image=None) == dataclasses.replace(b, image=None)
            assert a.meta == b.meta and a.image.encoded() == b.image.encoded()


def test_synthetic_builder_equals_the_aitz_and_packed_reads(built, tmp_path):
    data_dir, synthetic_aitz, _ = built
    pack_dataset("synthetic", synthetic_aitz, tmp_path / "packed")
    for split, n in (("train", 6), ("test", 3)):
        from_tfds = load_dataset(data_dir, "tfds:ipl_synthetic/tiny", split)
        direct = load_aitz(synthetic_aitz, split)
        assert len(from_tfds) == n
        for t, d in zip(from_tfds, direct, strict=True):
            assert t.episode_id == d.episode_id and t.instruction == d.instruction
            for ts, ds in zip(t.steps, d.steps, strict=True):
                assert dataclasses.replace(ts, image=None) == dataclasses.replace(ds, image=None)
                assert ts.image.encoded() == Path(ds.image).read_bytes()
        _same_steps(from_tfds, load_dataset(tmp_path / "packed", "arrayrecord", split))
    assert scoring_format("tfds:ipl_synthetic/tiny", data_dir) == "aitz"


def test_aitz_builder_from_a_manual_directory(built):
    data_dir, _, aitz_root = built
    source = tfds.data_source("ipl_aitz", data_dir=data_dir)
    assert {k: len(v) for k, v in source.items()} == {"train": 7, "test": 3}
    row = source["train"][0]  # as a TFDS user sees it: decoded screenshot, action JSON
    assert row["screenshot"].shape == (600, 270, 3) and row["screenshot"].dtype == np.uint8
    direct = load_aitz(aitz_root, "train")
    assert json.loads(row["action"]) == direct[0].steps[0].action.to_json()
    assert row["episode_id"] == b"101" and row["step_id"] == 0
    back = load_dataset(data_dir, "tfds:ipl_aitz", "train")
    assert [s.action for e in back for s in e.steps] == [s.action for e in direct for s in e.steps]
    assert [s.history for e in back for s in e.steps] == [s.history for e in direct for s in e.steps]
    np.testing.assert_array_equal(np.asarray(back[0].steps[0].load_image()), row["screenshot"])


def test_reading_needs_no_tensorflow(built):
    data_dir = built[0]
    script = (
        "import sys\n"
        "from ipl_jax.data.datasets import load_dataset\n"
        f"eps = load_dataset({str(data_dir)!r}, 'tfds:ipl_synthetic/tiny', 'test')\n"
        "print(len(eps), eps[0].steps[0].load_image().size, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # a fresh process that reads (and does not build) never imports TensorFlow, installed or not
    assert out.stdout.split()[-1] == "False" and out.stdout.split()[0] == "3"


def test_unknown_and_unprepared_names_are_one_line_errors(built, tmp_path):
    data_dir = built[0]
    with pytest.raises(ValueError) as err:
        load_dataset(data_dir, "tfds:ipl_nothing", "train")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(
        f"tfds:ipl_nothing (data_dir {data_dir}): no TFDS dataset 'ipl_nothing' is registered or prepared there"
    )
    with pytest.raises(ValueError, match="registered but not prepared"):
        load_dataset(tmp_path, "tfds:ipl_aitz", "train")
    with pytest.raises(ValueError, match=r"no split 'dev' \(have test, train\)"):
        load_dataset(data_dir, "tfds:ipl_aitz", "dev")


@pytest.mark.slow
def test_tfds_load_with_tensorflow(built, tmp_path):
    """``tfds.load`` (tf.data) where TensorFlow is installed (the ``tf`` extra). TFDS 4.9.10 serves array_record
    files only through ``data_source``, so this builds the same dataset in the tfrecord file format."""
    pytest.importorskip("tensorflow")
    _, _, aitz_root = built
    tfds.builder("ipl_aitz", data_dir=tmp_path, file_format="tfrecord").download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=str(aitz_root))
    )
    rows = list(tfds.as_numpy(tfds.load("ipl_aitz", split="train", data_dir=tmp_path)))
    direct = [s for e in load_aitz(aitz_root, "train") for s in e.steps]
    assert [(r["episode_id"].decode(), int(r["step_id"])) for r in rows] == [(s.episode_id, s.step_id) for s in direct]
    assert rows[0]["screenshot"].shape == (600, 270, 3)
