"""Each process builds only the rows of an SFT batch that its devices hold: the rows come from the batch
shardings, and the global arrays assembled from every process's local rows equal the one-host batch.

Processes are simulated inside one 8-device process by giving the helpers explicit device subsets (two
"processes" of four devices, each holding non-contiguous rows), so a wrong row assignment, a wrong piece or a
token bucket that the processes did not agree on shows up as a difference from ``make_batch_fn``'s batch.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from support import fake_devices

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from support import local_rows_setup as L
    from ipl_jax import distributed
    from ipl_jax.model.sharding import make_mesh
    from ipl_jax.pipeline.sft_stage import SFTRows, make_batch_fn
    from ipl_jax.training.sft import sft_batch_axes, sft_batch_shardings

    assert jax.device_count() == 8
    cfg, layout, tok, examples = L.setup()  # 8 examples: 2 micro-batches of 4 rows
    full = make_batch_fn(cfg, tok, *layout)(examples)
    mesh = make_mesh((2, 2, 2))
    sh = sft_batch_shardings(full, mesh, grad_accum=True)
    axes = sft_batch_axes(full, grad_accum=True)

    # one process holding every device: the rows are all of them and the batch is make_batch_fn's, placed
    rows = SFTRows(cfg, tok, *layout, lambda e: e, examples[0], mesh)
    assert rows.rows.tolist() == [0, 1, 2, 3]
    placed, tokens = rows.assemble(rows.local_batch(examples))
    L.assert_same(placed, full)
    assert tokens == sum(len(e) for e in examples)

    # two simulated processes: the devices of fsdp index p (the batch is split over data x fsdp, so rows p, p+2)
    procs = [list(mesh.devices[:, p].flat) for p in range(2)]
    held = [distributed.held_rows(sh, full, axes, 4, devices=d) for d in procs]
    assert [h.tolist() for h in held] == [[0, 2], [1, 3]], held
    local, built = [], []
    rows.example_fn = lambda e: built.append(e.name) or e
    for h in held:  # what each process's loader builds: its half of the examples, no more
        rows.rows, built[:] = h, []
        local.append(rows.local_batch(examples))
        assert sorted(built) == sorted(f"ex{a * 4 + r}" for a in range(2) for r in h), built
    buckets = [x.bucket for x in local]
    assert len(set(buckets)) == 2, buckets  # the processes' own buckets differ: agreeing on one matters
    t = max(buckets)
    pieces = {}
    for h, x, devs in zip(held, local, procs):
        rows.rows = h
        arrays = rows.local_arrays(x, t)
        for leaf, s, axis, key in zip(*(jax.tree.leaves(x) for x in (arrays, sh, axes)), range(99)):
            for d, p in distributed.local_pieces(leaf, s, axis, h, 4, devices=devs).items():
                pieces.setdefault(key, {})[d] = p
    leaves = []
    for key, (leaf, s) in enumerate(zip(jax.tree.leaves(full), jax.tree.leaves(sh))):
        ps = pieces[key]
        assert len(ps) == 8
        leaves.append(jax.make_array_from_single_device_arrays(
            leaf.shape, s, [jax.device_put(ps[d], d) for d in s.addressable_devices]))
    L.assert_same(jax.tree.unflatten(jax.tree.structure(full), leaves), full)

    # a process handed rows its devices do not hold is refused
    try:
        distributed.local_pieces(np.zeros((2, 2, 5)), jax.tree.leaves(sh)[0], 1, held[1], 4, devices=procs[0])
        raise SystemExit("wrong rows accepted")
    except ValueError as e:
        assert "not all among" in str(e)
    print("ok")
    """
)


def _run(script: str) -> None:
    """``script`` in a fresh 8-CPU-device process; it prints ok at its end."""
    out = fake_devices.run(script, fake_devices.TESTS)
    assert out.strip().endswith("ok"), out[-3000:]


@pytest.mark.e2e
def test_local_rows_assemble_to_the_one_host_batch():
    _run(SCRIPT)


def test_one_process_without_a_mesh_builds_the_batch_of_make_batch_fn():
    from support import local_rows_setup as L

    from ipl_jax.pipeline.sft_stage import SFTRows, make_batch_fn

    cfg, layout, tok, examples = L.setup()
    rows = SFTRows(cfg, tok, *layout, lambda e: e, examples[0], None)
    local = rows.local_batch(examples)
    assert [len(p) for p in local.examples] == [4, 4]
    batch, tokens = rows.assemble(local)
    full = make_batch_fn(cfg, tok, *layout)(examples)
    L.assert_same(batch, full)
    assert tokens == int(np.sum(full["attention_mask"]))
    assert full["input_ids"].shape[:2] == (2, 4) and full["vision"].patches.shape[:2] == (2, 4)


GOLDEN = textwrap.dedent(
    """
    import dataclasses, sys, tempfile, types
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from support import rl_setup as R
    from ipl_jax import fault_hook
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.model.sharding import make_mesh
    from ipl_jax.pipeline.model_stage import Policy
    from ipl_jax.pipeline.rounds_stage import golden_update_fn
    from ipl_jax.preference import tdpo as T

    tok = R.make_tokenizer(tempfile.mkdtemp())
    cfg = R.make_config(tok)
    overrides = ["--config.ipl.batch_size=4", "--config.sft.micro_batch_size=2", "--config.buckets.tokens=(512,)"]
    settings = load_settings("synthetic:quick", overrides)
    steps = R.golden_steps(2)[:6]
    optimizer = dataclasses.replace(T.IPL_OPTIMIZER, learning_rate=1e-4)
    rcfg = types.SimpleNamespace(tdpo=T.TDPOConfig(model=cfg, optimizer_settings=optimizer))

    kills = []  # the shared training loop's kill point, counted in updates
    fault_hook.kill_at = lambda point, n: kills.append((point, n))

    def run(mesh):
        _, params = R.make_model(tok)  # fresh arrays: the step donates the state
        update = golden_update_fn(settings, Policy(params, cfg, tok, R.image_config(), mesh=mesh), steps, rcfg)
        state, out = update(T.init_state(params, rcfg.tdpo, jax.random.PRNGKey(0)), 2, jax.random.PRNGKey(1))
        kernel = state.params["model"]["layers"]["mlp"]["up_proj"]["kernel"]
        return [m["loss"] for m in out["per_step"]], np.asarray(kernel)

    losses, kernel = run(None)
    sharded_losses, sharded_kernel = run(make_mesh((2, 2, 2)))
    np.testing.assert_allclose(sharded_losses, losses, rtol=1e-5)
    np.testing.assert_allclose(sharded_kernel, kernel, atol=1e-5)
    assert not np.allclose(kernel, R.make_model(tok)[1]["model"]["layers"]["mlp"]["up_proj"]["kernel"])
    assert kills == [("golden_sft_step", 1), ("golden_sft_step", 2)] * 2
    print("ok")
    """
)


@pytest.mark.e2e
def test_continued_sft_under_a_mesh_matches_one_device():
    """The continued-SFT control's updates on an 8-device mesh (batch rows built by ``SFTRows``, the step with
    warm-up SFT's shardings) equal those without a mesh."""
    _run(GOLDEN)


PACKED = textwrap.dedent(
    """
    import sys
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from support import local_rows_setup as L
    from support.small_models import tiny_cfg
    from support.tdpo_rounds import ROUND_PACKING, round_batches
    from ipl_jax import distributed
    from ipl_jax.model.sharding import make_mesh
    from ipl_jax.preference import packing as PK
    from ipl_jax.preference import tdpo

    cfg = tiny_cfg()
    groups, pairs, full = round_batches(cfg, seed=12)  # 2 batches of 4 rows, 8 groups with one image each
    mesh = make_mesh((2, 2, 2))
    assert distributed.batch_rows(4, mesh) is None  # one process holds every row: pack_round as before
    read = []
    prepare = PK.prepare_vision
    PK.prepare_vision = lambda cfg, pixels, *a: read.append(pixels) or prepare(cfg, pixels, *a)
    ids = {id(g.pixel_values): g.name for g in groups}
    procs = [list(mesh.devices[:, p].flat) for p in range(2)]  # rows split over data x fsdp: p holds p, p + 2
    pieces = {}
    for devs in procs:
        held = distributed.batch_rows(4, mesh, devices=devs)
        read.clear()
        local = PK.pack_round(cfg, groups, pairs, ROUND_PACKING, held)
        # this process read the screenshots of its own rows only: group 4 * k + r sits in row r of batch k
        assert sorted(ids[id(p)] for p in read) == sorted(f"g{4 * k + r}" for k in range(2) for r in held), read
        for k, (mine, want) in enumerate(zip(local, full)):
            L.assert_same(mine.replace(vision=None), want.replace(vision=None))  # text, pairs: every process
            assert mine.vision.patches.shape == (2, *want.vision.patches.shape[1:])
            sh = tdpo.batch_shardings(mine, mesh)
            assert jax.tree.leaves(sh) == jax.tree.leaves(tdpo.batch_shardings(want, mesh))
            for j, (leaf, s) in enumerate(zip(jax.tree.leaves(mine.vision), jax.tree.leaves(sh.vision))):
                for d, piece in distributed.local_pieces(leaf, s, 0, held, 4, devices=devs).items():
                    pieces.setdefault((k, j), {})[d] = piece
    for k, want in enumerate(full):
        sh = tdpo.batch_shardings(want, mesh)
        leaves = []
        for j, (leaf, s) in enumerate(zip(jax.tree.leaves(want.vision), jax.tree.leaves(sh.vision))):
            ps = pieces[(k, j)]
            assert len(ps) == 8
            leaves.append(jax.make_array_from_single_device_arrays(
                leaf.shape, s, [jax.device_put(ps[d], d) for d in s.addressable_devices]))
        L.assert_same(jax.tree.unflatten(jax.tree.structure(want.vision), leaves), want.vision)
    print("ok")
    """
)


@pytest.mark.e2e
def test_packed_batches_read_only_the_images_of_a_process_rows():
    """T-DPO packing in a process that holds some rows: text and pairs whole, image patches of its rows only
    (only those screenshots read); the pieces of both simulated processes make the one-host batches."""
    _run(PACKED)
