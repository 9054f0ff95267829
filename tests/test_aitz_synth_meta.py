"""The AITZ reader keeps the synthetic world's optional synth_meta field (transitions for instruction evolution)."""

import json

import pytest

from ipl_jax.data.aitz import load_aitz
from ipl_jax.data.records import DataError
from ipl_jax.envs.synthetic import generate_split
from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split


def test_synth_meta_round_trips_through_the_reader(tmp_path):
    episodes = generate_split("train", 2, seed=3)
    write_aitz_split(episodes, tmp_path, "train", with_meta=True)
    back = {e.episode_id: e for e in load_aitz(tmp_path, "train")}
    for ep in episodes:
        for s, r in zip(ep.steps, back[ep.episode_id].steps):
            assert r.meta["transitions"] == s.meta["transitions"]
            assert r.meta["app"] == s.meta["app"] and r.meta["dataset"] == "aitz"


def test_bad_synth_meta_names_the_field(tmp_path):
    episodes = generate_split("train", 1, seed=4)
    write_aitz_split(episodes, tmp_path, "train", with_meta=True)
    f = next(tmp_path.rglob("*.json"))
    recs = json.loads(f.read_text())
    recs[0]["synth_meta"] = "{not json"
    f.write_text(json.dumps(recs))
    with pytest.raises(DataError) as e:
        load_aitz(tmp_path, "train")
    assert e.value.field == "synth_meta"
