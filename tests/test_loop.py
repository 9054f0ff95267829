"""The training loop every trainer runs (``training.loop``), on a toy LM: the state placed once, each step's
metrics on the host as the hand-run step gives them (one step in flight or none), the kill point counted in
finished steps, a resumed loop counting from its step, checkpoints only without a step in flight."""

import jax
import numpy as np
import pytest
from support.toy_lm import opt_config, toy_batch, toy_logits, toy_params, toy_sft_step

from ipl_jax import fault_hook
from ipl_jax.training import optimizer as optim
from ipl_jax.training import state as tstate
from ipl_jax.training.loop import TrainLoop, place_state

OPT = opt_config()


@pytest.fixture(scope="module")
def step():
    return toy_sft_step(toy_logits, optim.make_optimizer(OPT), optim.make_schedule(OPT))


def _state():
    return tstate.create_train_state(toy_params(), optim.make_optimizer(OPT), jax.random.PRNGKey(0))


def _equal(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)))


def test_the_loop_places_once_and_reports_the_hand_run_steps(step, monkeypatch):
    batches = [toy_batch(i) for i in range(4)]
    state, by_hand = _state(), []
    for batch in batches:
        state, m = step(state, batch)
        by_hand.append({k: float(v) for k, v in m.items()})

    kills, placed = [], []
    monkeypatch.setattr(fault_hook, "kill_at", lambda point, n: kills.append((point, n)))

    def place(s):
        placed.append(int(s.step))
        return place_state(s, optim.make_optimizer(OPT), None)

    for in_flight in (False, True):
        seen = []
        loop = TrainLoop(
            step,
            kill_point="toy_step",
            desc="toy",
            place=place,
            in_flight=in_flight,
            on_metrics=lambda n, m: seen.append((n, m["loss"])),
        )
        final, history = loop.run(_state(), batches)  # a list: until the batches run out
        assert history == by_hand and _equal(final, state) and final is loop.state
        assert seen == [(k + 1, m["loss"]) for k, m in enumerate(by_hand)]
    assert placed == [0, 0]  # once a run, before its first step
    assert kills == [("toy_step", k) for k in (1, 2, 3, 4)] * 2

    # resumed at step 2 of 4: two steps, counted 3 and 4, from an endless iterator
    kills.clear()
    resumed, _ = TrainLoop(step, kill_point="toy_step", desc="toy").run(state, iter(batches * 9), start=2, num_steps=4)
    assert kills == [("toy_step", 3), ("toy_step", 4)] and int(resumed.step) == 6


def test_a_checkpointing_loop_keeps_no_step_in_flight(step):
    loop = TrainLoop(step, kill_point="toy_step", desc="toy", in_flight=True, checkpointer=object())
    with pytest.raises(ValueError, match="in_flight"):
        loop.run(_state(), [])


def test_place_state_commits_to_the_first_device_without_a_mesh():
    placed = place_state(_state(), optim.make_optimizer(OPT), None)
    assert all(x.committed and x.devices() == {jax.local_devices()[0]} for x in jax.tree.leaves(placed))
