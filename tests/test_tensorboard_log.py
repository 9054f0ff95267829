"""The TensorBoard writer on its own (the job's event files are checked against results.json in
test_pipeline_run.py): what a round entry becomes, what a disabled writer leaves, and events read back with
TensorBoard's reader."""

from __future__ import annotations

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, EventAccumulator

from ipl_jax.viz.tensorboard_log import TensorBoardLog, round_scalars, sft_scalars

ENTRY = {
    "round": 2,
    "metrics": {
        "test": {
            "total": {"count": 5, "type_acc": 0.8, "exact_acc": 0.6},
            "CLICK": {"count": 5, "type_acc": 0.8, "exact_acc": 0.6},
            "SCROLL": {"count": 0, "type_acc": None, "exact_acc": None},
            "episode_success": 0.5,
            "format": "aitz",
        }
    },
    "trees": {"alpha": 0.25, "beta": 0.5, "gamma": 0.25},
    "pairs": 7,
    "pairs_by_turn": [1, 2, 0, 4, 0],
    "pair_counts": {"by_class": {"beta": 5, "gamma": 2}, "by_type": {"click": 7}},
    "train": {"loss": 1.5, "reward_margin": 0.25, "method_note": "text is not a scalar"},
    "online": {"success_rate": 0.75, "mean_steps": 3.0, "truncated_rate": 0.0, "split": "test", "by_family": {}},
    "dev": {"step_accuracy": 0.4},
}


def _read(path) -> EventAccumulator:
    return EventAccumulator(str(path), size_guidance={SCALARS: 0, IMAGES: 0}).Reload()


def test_round_scalars_name_every_number_and_skip_the_rest():
    got = round_scalars(ENTRY)
    assert got == {
        "train/loss": 1.5,
        "train/reward_margin": 0.25,
        "pairs/total": 7.0,
        "pairs/by_turn/trajectory": 1.0,
        "pairs/by_turn/turn1": 2.0,
        "pairs/by_turn/turn2": 0.0,
        "pairs/by_turn/turn3": 4.0,
        "pairs/by_turn/turn4": 0.0,
        "pairs/by_class/beta": 5.0,
        "pairs/by_class/gamma": 2.0,
        "pairs/by_type/click": 7.0,
        "trees/alpha": 0.25,
        "trees/beta": 0.5,
        "trees/gamma": 0.25,
        "step_accuracy/test/CLICK": 0.6,
        "type_accuracy/test/CLICK": 0.8,
        "step_accuracy/test/total": 0.6,
        "type_accuracy/test/total": 0.8,
        "episode_success/test": 0.5,
        "dev/step_accuracy": 0.4,
        "online/success_rate": 0.75,
        "online/mean_steps": 3.0,
        "online/truncated_rate": 0.0,
    }
    start = {"round": 0, "metrics": {}, "trees": {"alpha": 0.0, "beta": 1.0, "gamma": 0.0}, "pairs": 0}
    assert set(round_scalars(start)) == {"trees/alpha", "trees/beta", "trees/gamma", "pairs/total"}
    record = {"stage": "sft", "step": 3, "loss": 2.5, "lr": 1e-3, "tokens": 100.0, "tokens_per_s": 40.0}
    assert sft_scalars(record) == {"sft/loss": 2.5, "sft/learning_rate": 1e-3, "sft/tokens_per_s": 40.0}


def test_events_read_back(tmp_path):
    log = TensorBoardLog(tmp_path / "tb")
    for step, loss in ((1, 3.25), (2, 2.5)):
        log.sft({"stage": "sft", "step": step, "loss": loss, "lr": 0.1 * step, "tokens_per_s": 10.0})
    log.round(ENTRY)
    png = tmp_path / "plot.png"
    Image.new("RGB", (12, 7), (200, 30, 30)).save(png)
    log.image("ipl", "step_accuracy", png, step=2)
    sft = _read(tmp_path / "tb" / "sft")  # read while the writer is still open: every event is flushed
    assert [(e.step, e.value) for e in sft.Scalars("sft/loss")] == [(1, 3.25), (2, 2.5)]
    np.testing.assert_array_equal([e.value for e in sft.Scalars("sft/learning_rate")], np.float32([0.1, 0.2]))
    log.close()
    ipl = _read(tmp_path / "tb" / "ipl")
    assert set(ipl.Tags()["scalars"]) == set(round_scalars(ENTRY))
    assert [(e.step, e.value) for e in ipl.Scalars("pairs/by_turn/turn3")] == [(2, 4.0)]
    (image,) = ipl.Images("step_accuracy")
    assert (image.step, image.width, image.height) == (2, 12, 7)
    assert image.encoded_image_string == png.read_bytes()


def test_a_disabled_log_writes_nothing(tmp_path):
    log = TensorBoardLog(tmp_path / "tb", enabled=False)
    log.sft({"stage": "sft", "step": 1, "loss": 1.0})
    log.round(ENTRY)
    log.image("ipl", "step_accuracy", tmp_path / "missing.png", step=0)
    log.close()
    assert not (tmp_path / "tb").exists()
