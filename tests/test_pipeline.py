"""Grain pipeline: deterministic shuffle, epochs, lazy image loading, batching, resumable iterator state
(plain JSON and through Orbax, alone and inside a composite training checkpoint)."""

import collections
import json
import threading

import numpy as np
import pytest
from PIL import Image

from ipl_jax.coat.actions import Action
from ipl_jax.data import pipeline
from ipl_jax.data.records import Step

N = 12


class ImageLoads:
    """Counts screenshot loads; each step's image is a callable that draws a 4×4 image of its index."""

    def __init__(self):
        self.count = collections.Counter()
        self.lock = threading.Lock()

    def image(self, i):
        def load():
            with self.lock:
                self.count[i] += 1
            return Image.new("RGB", (4, 4), (i, 2 * i, 3 * i))

        return load


def make_steps(loads):
    return [
        Step(
            episode_id="e",
            step_id=i,
            instruction="x",
            image=loads.image(i),
            screen_size=(4, 4),
            action=Action(type="stop"),
        )
        for i in range(N)
    ]


def to_arrays(step: Step) -> dict:
    """A fixed-shape example; the image is opened here, not before."""
    pixels = np.asarray(step.load_image(), dtype=np.float32)  # float32[4, 4, 3]
    return {"pixels": pixels, "index": np.int32(step.step_id)}


def batches_of(iterator, k=None):
    out = []
    for b in iterator:
        out.append(b["index"].tolist())
        if k is not None and len(out) == k:
            break
    return out


def build(seed=7, num_epochs=2, batch_size=4, loads=None, **kw):
    loads = loads or ImageLoads()
    ds = pipeline.make_dataset(
        make_steps(loads), to_arrays, batch_size=batch_size, seed=seed, num_epochs=num_epochs, **kw
    )
    return ds, loads


def test_batches_epochs_and_lazy_images():
    ds, loads = build()
    assert len(ds) == pipeline.num_batches(N, batch_size=4, num_epochs=2) == 6
    it = pipeline.make_iterator(ds)
    assert sum(loads.count.values()) == 0  # nothing opened before iteration
    first = next(it)
    assert first["pixels"].shape == (4, 4, 4, 3) and first["pixels"].dtype == np.float32
    assert first["index"].shape == (4,)
    # pixels come from the lazily loaded image of the right step
    assert np.array_equal(first["pixels"][:, 0, 0, 0], first["index"].astype(np.float32))
    rest = batches_of(it)
    order = first["index"].tolist() + [i for b in rest for i in b]
    assert collections.Counter(order) == {i: 2 for i in range(N)}  # two epochs: every example twice
    assert sorted(order[:N]) == list(range(N)) and order[:N] != list(range(N))  # shuffled epoch 1
    assert order[:N] != order[N:]  # epoch 2 reshuffled
    assert loads.count == {i: 2 for i in range(N)}  # each image opened once per use


def test_same_seed_same_order():
    a = batches_of(pipeline.make_iterator(build(seed=3)[0]))
    b = batches_of(pipeline.make_iterator(build(seed=3)[0]))
    c = batches_of(pipeline.make_iterator(build(seed=4)[0]))
    assert a == b and a != c


def test_drop_remainder_and_shards():
    ds, _ = build(num_epochs=1, batch_size=5)
    got = batches_of(pipeline.make_iterator(ds))
    assert len(got) == 2 and all(len(b) == 5 for b in got)  # 12 = 5 + 5 + 2 dropped
    ds, _ = build(num_epochs=1, batch_size=5, drop_remainder=False)
    assert [len(b) for b in batches_of(pipeline.make_iterator(ds))] == [5, 5, 2]
    shards = [
        batches_of(pipeline.make_iterator(build(num_epochs=1, batch_size=2, shard_index=s, shard_count=3)[0]))
        for s in range(3)
    ]
    seen = [i for sh in shards for b in sh for i in b]
    assert sorted(seen) == list(range(N))  # disjoint shards cover the source
    assert {i % 3 for b in shards[1] for i in b} == {1}


def test_resume_from_json_state():
    ds, _ = build()
    it = pipeline.make_iterator(ds)
    head = batches_of(it, k=2)
    state = json.loads(json.dumps(pipeline.iterator_state(it)))
    tail = batches_of(it)
    resumed = pipeline.restore_iterator(pipeline.make_iterator(build()[0]), state)
    assert batches_of(resumed) == tail and len(head) + len(tail) == 6


def test_resume_through_orbax(tmp_path):
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    ds, _ = build(seed=11, num_epochs=None)  # an endless stream, as in training
    it = pipeline.make_iterator(ds)
    batches_of(it, k=3)
    pipeline.save_iterator(tmp_path / "data_only", it)
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(
            3, args=ocp.args.Composite(params=ocp.args.StandardSave(params), data=pipeline.checkpoint_save_args(it))
        )
        mngr.wait_until_finished()
    expected = batches_of(it, k=4)

    fresh = pipeline.make_iterator(build(seed=11, num_epochs=None)[0])
    assert batches_of(pipeline.load_iterator(tmp_path / "data_only", fresh), k=4) == expected

    fresh = pipeline.make_iterator(build(seed=11, num_epochs=None)[0])
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        restored = mngr.restore(
            3,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(params), data=pipeline.checkpoint_restore_args(fresh)
            ),
        )
    assert np.array_equal(restored["params"]["w"], params["w"])
    assert batches_of(restored["data"], k=4) == expected


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        pipeline.make_dataset([], to_arrays, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="shard_index"):
        pipeline.make_dataset([1], to_arrays, batch_size=2, seed=0, shard_index=2, shard_count=2)
