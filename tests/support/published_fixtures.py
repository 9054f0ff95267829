"""Small datasets written in the published layouts (AITZ, AMEX, AndroidControl) and the synthetic world's, for
tests that need a whole dataset of each kind (packing, TFDS). Each writer returns the dataset root; the steps
cover every action type the format has, UI elements, CoaT fields and more than one split or episode."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image


def _png(size, shade) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (shade % 256, 100, 180)).save(buf, format="PNG")
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- AITZ

_AITZ_ACTIONS = [  # (result_action_type, touch [y, x], lift [y, x], text)
    (4, [0.30, 0.20], [0.30, 0.21], ""),  # tap inside the Wi-Fi box
    (4, [0.80, 0.50], [0.30, 0.50], ""),  # finger moves up
    (3, [-1, -1], [-1, -1], "hello"),
    (5, [-1, -1], [-1, -1], ""),
    (6, [-1, -1], [-1, -1], ""),
    (7, [-1, -1], [-1, -1], ""),
    (10, [-1, -1], [-1, -1], ""),
    (11, [-1, -1], [-1, -1], ""),
]


def write_aitz(
    root: Path,
    episodes=(("train", "general", "101", 4), ("train", "install", "102", 3), ("test", "google_apps", "201", 3)),
    size=(270, 600),
) -> Path:
    """AITZ layout: ``root/<split>/<subset>/<SUBSET>-<id>/`` with the episode JSON and one PNG per step."""
    root = Path(root)
    for n_ep, (split, subset, ep_id, n) in enumerate(episodes):
        name = f"{subset.upper()}-{ep_id}"
        folder = root / split / subset / name
        folder.mkdir(parents=True)
        records = []
        for i in range(n):
            code, touch, lift, text = _AITZ_ACTIONS[(i + 3 * n_ep) % len(_AITZ_ACTIONS)]
            (folder / f"{name}_{i}.png").write_bytes(_png(size, 30 * i + n_ep))
            records.append(
                {
                    "episode_id": ep_id,
                    "episode_length": n,
                    "step_id": i,
                    "instruction": f"task {ep_id}",
                    "image_path": f"{subset}/{name}/{name}_{i}.png",
                    "ui_positions": json.dumps([[150, 27, 60, 54], [0, 0, 600, 270]]),
                    "ui_text": json.dumps(["Wi-Fi", "page"]),
                    "ui_types": json.dumps(["ICON_WIFI", "TEXT"]),
                    "result_action_type": code,
                    "result_touch_yx": json.dumps(touch),
                    "result_lift_yx": json.dumps(lift),
                    "result_action_text": text,
                    "coat_screen_desc": f"screen {i}",
                    "coat_action_think": f"think {i}",
                    "coat_action_desc": f"desc {i}",
                    "coat_action_result": f"result {i}",
                }
            )
        (folder / f"{name}.json").write_text(json.dumps(records))
    return root


# ---------------------------------------------------------------------------------------------- AMEX

_AMEX_ACTIONS = [
    {"action": "TAP", "touch_coord": [216, 720], "lift_coord": [216, 720]},
    {"action": "SWIPE", "touch_coord": [540, 1800], "lift_coord": [540, 600]},
    {"action": "TYPE", "type_text": "pizza"},
    {"action": "PRESS_BACK"},
    {"action": "PRESS_HOME"},
    {"action": "TASK_COMPLETE"},
]


def write_amex(
    root: Path,
    episodes=(("ep_a", "Open Gmail. Read the mail.", 4), ("ep_b", "Open Yelp. Find pizza.", 3)),
    device=(1080, 2400),
    shot=(540, 1200),
) -> Path:
    """AMEX layout: ``instruction_anno/<id>.json``, ``screenshot/<image>``, ``element_anno/<stem>.json``."""
    root = Path(root)
    for d in ("instruction_anno", "screenshot", "element_anno"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for n_ep, (ep_id, instruction, n) in enumerate(episodes):
        steps = []
        for i in range(n):
            image = f"{ep_id}_{i}.png"
            (root / "screenshot" / image).write_bytes(_png(shot, 40 * i + n_ep))
            if i % 2 == 0:
                (root / "element_anno" / f"{ep_id}_{i}.json").write_text(
                    json.dumps(
                        {
                            "clickable_elements": [
                                {"bbox": [108, 600, 324, 840], "xml_desc": ["Wi-Fi"], "functionality": ""}
                            ],
                            "scrollable_elements": [
                                {"bbox": [0, 0, 1080, 2400], "xml_desc": ["list"], "functionality": ""}
                            ],
                        }
                    )
                )
            steps.append(
                {
                    "step_id": i,
                    "image_path": image,
                    "touch_coord": [-1, -1],
                    "lift_coord": [-1, -1],
                    "type_text": "",
                    "device_dim": list(device),
                    **_AMEX_ACTIONS[(i + 3 * n_ep) % len(_AMEX_ACTIONS)],
                }
            )
        (root / "instruction_anno" / f"{ep_id}.json").write_text(
            json.dumps({"episode_id": ep_id, "instruction": instruction, "steps": steps})
        )
    return root


# ---------------------------------------------------------------------------------------------- AndroidControl


def a11y_forest(nodes) -> bytes:
    """An accessibility forest (android_env's field numbers) of ``nodes`` = [(uid, (l, t, r, b), text, clickable)]."""
    from ipl_jax.data.a11y import forest_bytes

    return forest_bytes([(ltrb, text, "android.widget.TextView", clickable) for _, ltrb, text, clickable in nodes])


_AC_ACTIONS = [
    {"action_type": "click", "x": 54, "y": 150},
    {"action_type": "scroll", "direction": "down"},
    {"action_type": "input_text", "text": "hi"},
    {"action_type": "open_app", "app_name": "Mail"},
    {"action_type": "navigate_back"},
    {"action_type": "wait"},
]


def write_android_control(root: Path, episodes=((11, 3), (12, 4), (13, 2)), size=(270, 600)) -> Path:
    """AndroidControl layout: one GZIP TFRecord shard of ``tf.train.Example`` per two episodes, splits.json and
    test_subsplits.json (episode 11 train, 12 validation, 13 test)."""
    from ipl_jax.data.tfrecords import example_bytes, write_tfrecords

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tree = a11y_forest([(1, (0, 120, 270, 180), "Wi-Fi", True)])
    examples = []
    for n_ep, (ep_id, n_actions) in enumerate(episodes):
        n = n_actions + 1
        acts = [_AC_ACTIONS[(i + n_ep) % len(_AC_ACTIONS)] for i in range(n_actions)]
        examples.append(
            {
                "episode_id": ([ep_id], "int"),
                "goal": ([f"goal {ep_id}".encode()], "byte"),
                "screenshots": ([_png(size, 50 * i + n_ep) for i in range(n)], "byte"),
                "screenshot_widths": ([size[0]] * n, "int"),
                "screenshot_heights": ([size[1]] * n, "int"),
                "accessibility_trees": ([tree] * n, "byte"),
                "actions": ([json.dumps(a).encode() for a in acts], "byte"),
                "step_instructions": ([f"step {i}".encode() for i in range(n_actions)], "byte"),
            }
        )
    for k in range(0, len(examples), 2):
        shard = root / f"android_control-{k // 2:05d}-of-{(len(examples) + 1) // 2:05d}"
        write_tfrecords(shard, [example_bytes(ex) for ex in examples[k : k + 2]])
    ids = [e for e, _ in episodes]
    (root / "splits.json").write_text(json.dumps({"train": ids[:1], "validation": ids[1:2], "test": ids[2:]}))
    (root / "test_subsplits.json").write_text(
        json.dumps({"IDD": ids[2:], "app_unseen": [], "task_unseen": ids[2:], "category_unseen": []})
    )
    return root


# ---------------------------------------------------------------------------------------------- synthetic


def write_synthetic(root: Path, sizes=(("train", 4), ("test", 2)), seed: int = 0) -> Path:
    """The synthetic world's episodes written in the AITZ layout (``ipl-jax synth --with-meta``)."""
    from ipl_jax.envs.synthetic import generate_split
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split

    for split, n in sizes:
        write_aitz_split(generate_split(split, n, seed=seed), root, split, with_meta=True)
    return Path(root)


WRITERS = {
    "aitz": write_aitz,
    "amex": write_amex,
    "androidcontrol": write_android_control,
    "synthetic": write_synthetic,
}


def tiny_checkpoint_and_data(root: Path) -> tuple[Path, Path]:
    """(a random tiny checkpoint, an AITZ root whose ``test`` split holds two synthetic episodes) under ``root``:
    what a command reading a model and a dataset needs, made in about a second."""
    from ipl_jax.data.tiny import make_tiny_checkpoint
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split
    from ipl_jax.envs.synthetic.dataset import generate_split

    ckpt = make_tiny_checkpoint(root / "ckpt", seed=0, scale=4.0)
    write_aitz_split(generate_split("train", 2, seed=0), root / "data", "test")
    return ckpt, root / "data"
