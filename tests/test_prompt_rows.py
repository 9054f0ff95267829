"""The tree sampler's screenshots are decoded on demand, and under a mesh each process decodes those of the
sampler rows its devices hold only.

``step_prompts`` reads the screenshot's grid from its header and decodes the pixels when first read, once; the
pixels equal eager decoding. On a fake 8-device mesh two processes are simulated by explicit device subsets (as
in test_local_rows): each builds the image slots of its own rows from its own decodes, and the pieces both hand
over make exactly the one-host placed prompt arrays; with one process the sampled trees equal today's.
"""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest
from support import fake_devices
from support.trees import assert_trees_equal

SCRIPT = textwrap.dedent(
    """
    import dataclasses, sys, tempfile
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from support import local_rows_setup as L
    from support import rl_setup as R
    from ipl_jax import distributed
    from ipl_jax.data.records import Step
    from ipl_jax.model.sharding import inputs_shardings, make_mesh, param_shardings, shard_params
    from ipl_jax.sampling.batches import iter_sampled_batches
    from ipl_jax.sampling.prompts import pack_tree_prompts, step_prompts
    from ipl_jax.sampling.tree_sampler import sample_tree
    from ipl_jax.sampling.tree_sampler import place_prompts, prefix_shardings, prompt_vision_rows

    assert jax.device_count() == 8
    tmp = tempfile.mkdtemp()
    tok = R.make_tokenizer(tmp)
    cfg, params = R.make_model(tok)
    ic = R.image_config()
    sc = dataclasses.replace(R.sampler_config(tok), image_patches=32)  # 56x112 screenshots: 32 patches each
    steps = []
    for i, s in enumerate(R.golden_steps(2)[:7]):  # 7 steps: 2 batches of 4 rows, the last row a padding row
        path = f"{tmp}/s{i}.png"
        s.load_image().save(path)
        steps.append(dataclasses.replace(s, image=path))
    names = [f"{s.episode_id}/{s.step_id}" for s in steps]
    decoded = []
    load = Step.load_image
    Step.load_image = lambda self: decoded.append(f"{self.episode_id}/{self.step_id}") or load(self)

    # the one-host prompts, decoded eagerly as before, and the same placed under the mesh
    eager = [step_prompts(s, tok, ic, cfg, image=load(s)) for s in steps]
    chunks = [(0, eager[:4]), (4, eager[4:])]
    full = [pack_tree_prompts(cfg, c, sc, 5, step_index=range(k, k + len(c)), batch_size=4) for k, c in chunks]
    mesh = make_mesh((2, 2, 2))
    placed = [place_prompts(p, mesh) for p in full]
    assert decoded == []

    # two simulated processes: the devices of fsdp index p (rows split over data x fsdp: p holds rows p, p + 2)
    procs = [list(mesh.devices[:, p].flat) for p in range(2)]
    pieces, per_process = {}, []
    for p, devs in enumerate(procs):
        held = prompt_vision_rows(4, mesh, sc, devices=devs)
        assert held.tolist() == [p, p + 2], held
        items = [step_prompts(s, tok, ic, cfg) for s in steps]  # ids and grids only: nothing decoded yet
        assert decoded == []
        for b, (k, _) in enumerate(chunks):
            rows = items[k : k + 4]
            mine = pack_tree_prompts(cfg, rows, sc, 5, step_index=range(k, k + len(rows)), batch_size=4,
                                     vision_rows=held)
            assert mine.vision_rows == tuple(held.tolist())
            # text leaves, keys and masks: the one-host values in every process
            L.assert_same(mine.replace(prefix=mine.prefix.replace(vision=None), vision_rows=None),
                          full[b].replace(prefix=full[b].prefix.replace(vision=None)))
            sh = prefix_shardings(mine, mesh).vision  # from this process's prompts, as place_prompts does
            assert jax.tree.leaves(sh) == jax.tree.leaves(inputs_shardings(full[b].prefix, mesh).vision)
            for j, (leaf, s) in enumerate(zip(jax.tree.leaves(mine.prefix.vision), jax.tree.leaves(sh))):
                assert leaf.shape[0] == 2
                for d, piece in distributed.local_pieces(leaf, s, 0, held, 4, devices=devs).items():
                    pieces.setdefault((b, j), {})[d] = piece
        # this process decoded the screenshots of its rows, each once (the padding row repeats step 6)
        want = sorted({names[min(k + r, 6)] for k in (0, 4) for r in held})
        assert sorted(decoded) == want, (decoded, want)
        per_process.append(len(decoded))
        decoded.clear()
        # a later stage reading a step this process did not hold decodes it then, once
        items[1 - p].pixel_values, items[1 - p].pixel_values
        assert decoded == [names[1 - p]], decoded
        decoded.clear()
    for b, want in enumerate(placed):
        leaves = []
        for j, (leaf, s) in enumerate(zip(jax.tree.leaves(want.prefix.vision),
                                          jax.tree.leaves(inputs_shardings(full[b].prefix, mesh).vision))):
            ps = pieces[(b, j)]
            assert len(ps) == 8
            got = jax.make_array_from_single_device_arrays(leaf.shape, s, [jax.device_put(ps[d], d) for d in ps])
            assert got.sharding == leaf.sharding
            leaves.append(got)
        L.assert_same(jax.tree.unflatten(jax.tree.structure(want.prefix.vision), leaves), want.prefix.vision)

    # one process: the trees of the lazy, per-row path equal those of today's eager prompts (one compilation)
    params = shard_params(params, param_shardings(params, mesh))
    today = [jax.device_get(sample_tree(params, cfg, p, sc, mesh)) for p in full]
    batches = list(iter_sampled_batches(params, cfg, tok, ic, steps, sc, 5, 4, mesh))
    assert sorted(decoded) == sorted(names), decoded  # every row held here: each screenshot decoded once
    explicit = [pack_tree_prompts(cfg, [step_prompts(s, tok, ic, cfg) for s in steps[k : k + 4]], sc, 5,
                                  step_index=range(k, k + len(c)), batch_size=4, vision_rows=range(4))
                for k, c in chunks]
    explicit = [jax.device_get(sample_tree(params, cfg, p, sc, mesh)) for p in explicit]
    for want, got, again in zip(today, batches, explicit):
        for t in range(4):
            np.testing.assert_array_equal(got.tree.tokens[t], want.tokens[t])
            np.testing.assert_array_equal(got.tree.lengths[t], want.lengths[t])
            np.testing.assert_array_equal(again.tokens[t], want.tokens[t])
    assert sum(int(np.sum(w.lengths[0])) for w in today) > 0
    print("decodes per process", per_process, "of", len(steps))
    print("ok")
    """
)


@pytest.mark.e2e
def test_each_process_decodes_only_its_rows_and_the_pieces_make_the_one_host_prompts():
    out = fake_devices.run(SCRIPT, fake_devices.TESTS, timeout=600)
    assert out.strip().endswith("ok"), out[-3000:]
    assert "decodes per process [4, 4] of 7" in out, out


def test_lazy_step_prompts_decode_once_and_equal_eager_decoding(tmp_path, monkeypatch):
    from support import rl_setup as R

    from ipl_jax.data.records import Step
    from ipl_jax.data.screenshots import ScreenPixels
    from ipl_jax.preference.grouping import _pixels
    from ipl_jax.sampling.prompts import step_prompts

    tok = R.make_tokenizer(tmp_path)
    cfg = R.make_config(tok)
    ic = R.image_config()
    painted = R.golden_steps(1)[0]  # a ScreenPainter reference: its size is an attribute
    path = tmp_path / "s.png"
    painted.load_image().resize((400, 180)).save(path)  # resized: the grid must come from this file's header
    on_disk = dataclasses.replace(painted, image=str(path))
    loads = []
    load = Step.load_image
    monkeypatch.setattr(Step, "load_image", lambda self: loads.append(1) or load(self))
    for step in (painted, on_disk):
        eager = step_prompts(step, tok, ic, cfg, image=load(step))
        lazy = step_prompts(step, tok, ic, cfg)
        assert isinstance(lazy.pixels, ScreenPixels) and not lazy.pixels.loaded and loads == []
        np.testing.assert_array_equal(lazy.prefix_ids, eager.prefix_ids)
        np.testing.assert_array_equal(lazy.image_grid_thw, eager.image_grid_thw)
        assert_trees_equal(lazy.turn_prompt_ids, eager.turn_prompt_ids)
        assert _pixels(lazy) is lazy.pixels  # what the preference groups copy: the same undecoded screenshot
        pv = lazy.pixel_values
        assert pv.dtype == eager.pixel_values.dtype
        np.testing.assert_array_equal(pv, eager.pixel_values)
        assert lazy.pixel_values is pv and np.asarray(lazy.pixels, np.float32) is pv and loads == [1]
        loads.clear()
    assert not np.array_equal(
        step_prompts(on_disk, tok, ic, cfg).image_grid_thw, step_prompts(painted, tok, ic, cfg).image_grid_thw
    )
    # arrays given at construction are kept as they are
    given = np.ones((4, 3), np.float32)
    sp = type(eager)(eager.prefix_ids, eager.turn_prompt_ids, given, np.asarray([[1, 2, 2]]), uid=3)
    assert sp.pixel_values is given and sp.uid == 3


def test_a_screenshot_whose_decoded_grid_differs_from_its_header_is_refused():
    from ipl_jax.data.screenshots import ScreenPixels

    bad = ScreenPixels([[1, 4, 4]], load=lambda: (np.zeros((32, 3), np.float32), np.asarray([[1, 4, 8]])), name="e/0")
    try:
        bad.values()
        raise AssertionError("a mismatched grid was accepted")
    except ValueError as e:
        assert "e/0" in str(e) and "[[1, 4, 8]]" in str(e)
