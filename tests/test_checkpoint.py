"""Orbax checkpoints: exact round trip, schedule + retention, export of model params, a restore onto a mesh of
other devices, and a run killed with SIGKILL mid-way that resumes to the same final params as an uninterrupted
run (bit-equal on CPU).

Run as a script, this file is the training job the kill test starts in a subprocess:
    python tests/test_checkpoint.py RUN_DIR NUM_STEPS SAVE_EVERY STEP_DELAY_S XLA_CACHE_DIR
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, when run as a script
from support import small_models, toy_lm
from support.commands import run_ok
from support.small_models import tiny_training_batch
from support.trees import assert_trees_equal

from ipl_jax.training import optimizer as optim
from ipl_jax.training import sft
from ipl_jax.training import state as tstate
from ipl_jax.training.checkpoint import Checkpointer
from ipl_jax.training.loop import TrainLoop
from ipl_jax.training.lora import LoraConfig, flatten_with_paths, merge_lora


def toy_state(steps=2, **kw):
    """A toy-LM TrainState after ``steps`` updates (non-trivial Adam moments, step and key)."""
    config = toy_lm.opt_config()
    opt = optim.make_optimizer(config)
    state = tstate.create_train_state(toy_lm.toy_params(), opt, jax.random.PRNGKey(7), **kw)
    step = toy_lm.toy_sft_step(toy_lm.toy_logits, opt, optim.make_schedule(config))
    for i in range(steps):  # the step is compiled only when steps > 0
        state, _ = step(state, toy_lm.toy_batch(i))
    return state, opt


def test_round_trip_is_exact(tmp_path):
    state, opt = toy_state(steps=2, freeze_regex=tstate.VISION_REGEX)
    saved = jax.tree.map(np.array, state)
    template = tstate.create_train_state(
        toy_lm.toy_params(seed=1), opt, jax.random.PRNGKey(0), freeze_regex=tstate.VISION_REGEX
    )
    with Checkpointer(tmp_path / "ck", save_every=1) as ck:
        assert ck.save(2, state, data_state={"next_index": 5, "epoch": [1, 2]}, metadata={"config": {"lr": 0.1}})
        ck.wait()
        restored, data_state, meta = ck.restore(template)
    assert_trees_equal(restored, saved)
    assert int(restored.step) == 2 and restored.rng.dtype == np.uint32
    assert data_state == {"next_index": 5, "epoch": [1, 2]}
    assert meta == {"step": 2, "config": {"lr": 0.1}}
    # An abstract template works too, and bytes (grain DataLoader state) come back as bytes.
    with Checkpointer(tmp_path / "ck2", save_every=1, async_save=False) as ck:
        ck.save(3, state, data_state=b'{"pos": 3}')
        abstract = jax.eval_shape(lambda: template)
        restored, data_state, _ = ck.restore(abstract)
    assert_trees_equal(restored, saved)
    assert data_state == b'{"pos": 3}'


def test_save_schedule_and_retention(tmp_path):
    state, _ = toy_state(steps=0)
    with Checkpointer(tmp_path / "ck", save_every=3, keep=2) as ck:
        started = [s for s in range(1, 11) if ck.save(s, state, force=s == 10)]
        ck.wait()
        assert started == [3, 6, 9, 10]
        assert ck.all_steps() == [9, 10] and ck.latest_step() == 10
        assert not ck.save(10, state, force=True)  # an existing step is never overwritten
    with Checkpointer(tmp_path / "empty") as ck:
        assert ck.latest_step() is None
        try:
            ck.restore(state)
        except FileNotFoundError as e:
            assert "no checkpoint" in str(e)
        else:
            raise AssertionError("restore without a checkpoint must fail")


def test_load_model_params_merges_lora_and_frozen(tmp_path):
    lora_state, _ = toy_state(steps=0, lora=LoraConfig(rank=2, alpha=4.0, targets=("up_proj/kernel$",)))
    rng = np.random.default_rng(0)  # non-zero B (as after training) without compiling a training step
    lora_state = lora_state.replace(
        params=jax.tree.map(lambda x: np.asarray(rng.standard_normal(x.shape), np.float32), lora_state.params)
    )
    expected = jax.device_get(merge_lora(lora_state.frozen, lora_state.params))
    with Checkpointer(tmp_path / "lora", save_every=1) as ck:
        ck.save(2, lora_state)
        ck.wait()
        params, meta = ck.load_model_params()
    assert meta["lora_scale"] == 2.0
    assert_trees_equal(params, expected)

    frozen_state, _ = toy_state(steps=0, freeze_regex=tstate.VISION_REGEX)
    expected = jax.device_get(tstate.model_params(frozen_state.params, frozen_state.frozen))
    with Checkpointer(tmp_path / "frozen", save_every=1) as ck:
        ck.save(1, frozen_state)
        ck.wait()
        params, _ = ck.load_model_params()
    assert_trees_equal(params, expected)


# ------------------------------------------------------------------------------- another mesh

MESH_SCRIPT = """
import sys
import jax
import numpy as np
from support import small_models, toy_lm
from support.trees import assert_trees_equal
from ipl_jax.model.sharding import make_mesh
from ipl_jax.training import optimizer as optim, state as tstate
from ipl_jax.training.checkpoint import Checkpointer

mode, directory = sys.argv[1], sys.argv[2]
opt = optim.make_optimizer(toy_lm.opt_config())
state = tstate.create_train_state(small_models.numpy_params(small_models.tiny_cfg()), opt, jax.random.PRNGKey(0))
if jax.device_count() > 1:  # the template on this process's mesh: FSDP over every device
    state = jax.device_put(state, tstate.state_shardings(state, opt, make_mesh((1, -1, 1))))
split = [x for x in jax.tree.leaves(state) if not x.sharding.is_fully_replicated]
moved = jax.tree.map(lambda x: x + 3, state)  # what was saved: every leaf (moments, step, key) unlike the template
if mode == "save":
    with Checkpointer(directory, save_every=1) as ck:
        ck.save(3, moved)
else:
    restored, _, _ = Checkpointer(directory).restore(state)
    assert_trees_equal(jax.device_get(restored), jax.device_get(moved))

    def same_sharding(path, r, t):
        assert r.sharding == t.sharding, (jax.tree_util.keystr(path), r.sharding, t.sharding)

    jax.tree_util.tree_map_with_path(same_sharding, restored, state)
print(jax.device_count(), len(split))
"""


@pytest.mark.e2e
def test_restore_onto_another_mesh(tmp_path):
    """A TrainState saved FSDP-sharded over four devices restores onto two (FSDP over two) and onto one device:
    the values as saved, each leaf with the template's sharding on the new devices."""
    from support import fake_devices

    directory = str(tmp_path / "ckpt")
    run = lambda mode, n: fake_devices.run(
        f"import sys; sys.path.insert(0, 'tests')\n{MESH_SCRIPT}", mode, directory, devices=n
    )
    devices, split = map(int, run("save", 4).split())
    assert devices == 4 and split > 0  # the saved state is sharded
    devices, split = map(int, run("restore", 2).split())
    assert devices == 2 and split > 0
    assert run("restore", 1).split() == ["1", "0"]


# ------------------------------------------------------------------------------- SIGKILL and resume


def run_training_job(run_dir: str, num_steps: int, save_every: int, step_delay: float, cache_dir: str) -> None:
    """The job of the kill test: SFT of the tiny Qwen2-VL (vision tower frozen) on a grain pipeline, resuming
    from the latest checkpoint when there is one; writes final.npz at the end."""
    import grain

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    cfg = small_models.tiny_cfg()
    config = toy_lm.opt_config(learning_rate=3e-3, warmup_steps=2, total_steps=num_steps, weight_decay=0.01)
    opt = optim.make_optimizer(config)
    state = tstate.create_train_state(
        small_models.numpy_params(cfg), opt, jax.random.PRNGKey(0), freeze_regex=tstate.VISION_REGEX
    )
    data = (
        grain.MapDataset.range(10_000)
        .shuffle(seed=3)
        .map(lambda i: sft.sft_model_batch(cfg, tiny_training_batch(cfg, int(i), b=2, patch_bucket=48)))
        .to_iter_dataset()
    )
    batches = iter(data)
    ckpt = Checkpointer(Path(run_dir) / "ckpt", save_every=save_every, keep=2)
    if ckpt.latest_step() is not None:
        state, data_state, meta = ckpt.restore(state)
        batches.set_state(data_state)
        print(json.dumps({"resumed_from": int(state.step), "meta_step": meta["step"]}), flush=True)
    step_config = sft.SFTStepConfig(model=cfg, optimizer=config, logp_chunk=8)

    def step(st, batch):
        return sft.sft_step(st, batch, step_config)

    def on_metrics(n, metrics):
        print(json.dumps({"step": n, "loss": metrics["loss"]}), flush=True)
        time.sleep(step_delay)

    loop = TrainLoop(
        step,
        kill_point="sft_step",
        desc="SFT",
        on_metrics=on_metrics,
        checkpointer=ckpt,
        data_state_fn=batches.get_state,
        metadata_fn=lambda: {"job": "kill-test"},
    )
    state, _ = loop.run(state, batches, start=int(state.step), num_steps=num_steps)
    ckpt.close()
    flat = flatten_with_paths(
        jax.device_get({"params": state.params, "opt_state": state.opt_state, "rng": state.rng, "step": state.step})
    )
    np.savez(Path(run_dir) / "final.npz", **{k.replace("/", "|"): v for k, v in flat.items()})


def _job(run_dir, num_steps, save_every, delay, cache_dir):
    return [
        sys.executable,
        os.path.abspath(__file__),
        str(run_dir),
        str(num_steps),
        str(save_every),
        str(delay),
        str(cache_dir),
    ]


@pytest.mark.e2e
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    repo = Path(__file__).resolve().parent.parent
    cache = tmp_path / "xla_cache"
    n_steps, every = 7, 2

    full = run_ok(
        _job(tmp_path / "full", n_steps, every, 0, cache),
        cwd=repo,
        env=env,
        timeout=300,
    )

    killed_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        _job(killed_dir, n_steps, every, 0.5, cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=repo,
    )
    try:
        deadline = time.time() + 240
        while not (killed_dir / "ckpt" / "4").is_dir():  # orbax renames the finished step directory into place
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed_dir / "final.npz").exists()

    resumed = subprocess.run(
        _job(killed_dir, n_steps, every, 0, cache), capture_output=True, text=True, env=env, cwd=repo, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    info = json.loads(resumed.stdout.splitlines()[0])
    assert 4 <= info["resumed_from"] < n_steps and info["meta_step"] == info["resumed_from"]

    a, b = np.load(tmp_path / "full" / "final.npz"), np.load(killed_dir / "final.npz")
    assert int(a["step"]) == n_steps
    assert_trees_equal(dict(a), dict(b))  # bit-equal
    full_losses = [json.loads(line)["loss"] for line in full.stdout.splitlines() if '"loss"' in line]
    resumed_losses = [json.loads(line)["loss"] for line in resumed.stdout.splitlines() if '"loss"' in line]
    assert resumed_losses == full_losses[info["resumed_from"] :]


if __name__ == "__main__":
    run_training_job(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
