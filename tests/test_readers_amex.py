"""AMEX reader on fixture episodes written in the published layout (instruction_anno / element_anno /
screenshot; pixel [x, y] points normalised by device_dim)."""

import json
from pathlib import Path

import pytest
from PIL import Image

from ipl_jax.coat.actions import Action
from ipl_jax.data.amex import app_of_instruction, load_amex, load_amex_with_report
from ipl_jax.data.records import DataError

DEVICE = [1080, 2400]
SHOT = (540, 1200)  # screenshots stored at half the device size: points still normalise by device_dim


def write_episode(
    root: Path, ep_id: str, instruction: str, steps: list[dict], elements: dict | None = None, sub: str = ""
):
    """Write ``instruction_anno[/sub]/<ep_id>.json``, one screenshot per step and the given element files."""
    anno = root / "instruction_anno" / sub if sub else root / "instruction_anno"
    anno.mkdir(parents=True, exist_ok=True)
    (root / "screenshot").mkdir(exist_ok=True)
    (root / "element_anno").mkdir(exist_ok=True)
    out = []
    for i, st in enumerate(steps):
        image = f"{ep_id}_{i}.png"
        Image.new("RGB", SHOT, (40, 80, i * 30 % 255)).save(root / "screenshot" / image)
        rec = {
            "step_id": i,
            "image_path": image,
            "touch_coord": [-1, -1],
            "lift_coord": [-1, -1],
            "type_text": "",
            "device_dim": DEVICE,
        }
        rec.update(st)
        out.append(rec)
    for stem, data in (elements or {}).items():
        (root / "element_anno" / f"{stem}.json").write_text(json.dumps(data))
    f = anno / f"{ep_id}.json"
    f.write_text(json.dumps({"episode_id": ep_id, "instruction": instruction, "steps": out}))
    return f


ELEMENTS_0 = {
    "clickable_elements": [
        {"bbox": [0, 480, 1080, 960], "xml_desc": ["", "Settings list"], "functionality": "a list"},
        {"bbox": [108, 600, 324, 840], "xml_desc": ["Wi-Fi"], "functionality": "opens wifi"},
    ],
    # smaller than the Wi-Fi button and containing the tap, but not clickable: never the target
    "scrollable_elements": [{"bbox": [200, 700, 230, 740], "xml_desc": ["pager"], "functionality": ""}],
}


@pytest.fixture()
def amex_root(tmp_path):
    write_episode(
        tmp_path,
        "ep_a",
        "Open Citymapper. Find a route home.",
        [
            {"action": "TAP", "touch_coord": [216, 720], "lift_coord": [216, 720]},
            # |Δx|/W = 0.407 > |Δy|/H = 0.25 -> horizontal (in raw pixels |Δy| = 600 > |Δx| = 440)
            {"action": "SWIPE", "touch_coord": [540, 1800], "lift_coord": [100, 1200]},
            {"action": "SWIPE", "touch_coord": [540, 600], "lift_coord": [600, 2000]},
            {"action": "TYPE", "type_text": "home"},
            {"action": "PRESS_BACK"},
            {"action": "PRESS_HOME"},
            {"action": "PRESS_ENTER"},
            {"action": "TASK_COMPLETE"},
        ],
        elements={"ep_a_0": ELEMENTS_0},
    )
    write_episode(
        tmp_path,
        "ep_b",
        "Open Microsoft To Do. Add a task.",
        [
            {"action": "TAP", "touch_coord": [1000, 100], "lift_coord": [1000, 100]},  # no element file
            {"action": "TASK_IMPOSSIBLE"},
        ],
    )
    return tmp_path


def test_actions_points_and_targets(amex_root):
    eps = load_amex(amex_root)
    assert [e.episode_id for e in eps] == ["ep_a", "ep_b"]
    s = eps[0].steps
    assert s[0].screen_size == SHOT
    tap = s[0].action
    assert tap.type == "click" and tap.point == pytest.approx((0.2, 0.3))
    assert tap.box == pytest.approx((0.1, 0.25, 0.3, 0.35)) and tap.target == "Wi-Fi"
    assert s[0].elements[0].text == "Settings list" and not s[0].elements[2].clickable
    assert s[1].action == Action(type="scroll", direction="left")
    assert s[2].action == Action(type="scroll", direction="down")
    assert s[3].action == Action(type="type", text="home")
    assert [s[i].action.button for i in (4, 5, 6)] == ["back", "home", "enter"]
    assert s[7].action == Action(type="stop")
    assert s[2].history == ("click Wi-Fi", "scroll left")
    assert s[0].meta["app"] == "citymapper" and s[0].meta["episode_id"] == "ep_a"

    b = eps[1].steps
    assert b[0].elements == () and b[0].action.box is None and b[0].meta["has_element_anno"] is False
    assert b[0].action.point == pytest.approx((1000 / 1080, 100 / 2400))
    assert b[1].action == Action(type="stop", status="impossible")
    assert b[0].meta["app"] == "microsoft to do"
    assert b[0].load_image().size == SHOT


def test_app_names_of_the_test_table():
    assert app_of_instruction("Open YouTube Music. Play the top song.") == "youtube music"
    assert app_of_instruction("open the NBC News app, read the headline") == "nbc news"
    assert app_of_instruction("Open Gmail.") == "gmail"
    assert app_of_instruction("Find a hotel in Paris") is None


def test_split_folder_and_episode_ids(amex_root):
    write_episode(amex_root, "ep_t", "Open Yelp. Find pizza.", [{"action": "TASK_COMPLETE"}], sub="test")
    assert [e.episode_id for e in load_amex(amex_root, split="test")] == ["ep_t"]
    assert [e.episode_id for e in load_amex(amex_root, episode_ids=["ep_b"])] == ["ep_b"]
    with pytest.raises(FileNotFoundError, match="validation"):
        load_amex(amex_root, split="validation")


def test_malformed_records(amex_root):
    f = write_episode(
        amex_root,
        "ep_c",
        "Open Signal. Text Bob.",
        [
            {"action": "PRESS_HOME"},
            {"action": "TAP", "touch_coord": [1, 2, 3]},
            {"action": "TASK_COMPLETE"},
        ],
    )
    with pytest.raises(DataError) as exc:
        load_amex(amex_root)
    assert exc.value.file == str(f) and exc.value.record == "steps[1]" and exc.value.field == "touch_coord"

    eps, skipped = load_amex_with_report(amex_root, skip_bad=True)
    assert [e.field for e in skipped] == ["touch_coord"]
    c = [e for e in eps if e.episode_id == "ep_c"][0]
    assert [s.step_id for s in c.steps] == [0, 2] and c.steps[1].meta["history_gap"] is True
    assert sum(len(e.steps) for e in eps) == 8 + 2 + 2


@pytest.mark.parametrize(
    "step,field",
    [
        ({"action": "LONG_TAP"}, "action"),
        ({"action": "TAP", "touch_coord": [2000, 10], "lift_coord": [2000, 10]}, "touch_coord"),
        ({"action": "TASK_COMPLETE", "device_dim": [0, 2400]}, "device_dim"),
        ({"action": "TASK_COMPLETE", "image_path": "missing.png"}, "image_path"),
    ],
)
def test_each_malformed_field_is_named(tmp_path, step, field):
    f = write_episode(tmp_path, "x", "Open Gmail.", [{"action": "TASK_COMPLETE"}])
    data = json.loads(f.read_text())
    data["steps"][0].update(step)
    f.write_text(json.dumps(data))
    with pytest.raises(DataError) as exc:
        load_amex(tmp_path)
    assert exc.value.field == field


def test_malformed_element_file_is_named(amex_root):
    (amex_root / "element_anno" / "ep_a_0.json").write_text(json.dumps({"clickable_elements": [{"bbox": [1, 2]}]}))
    with pytest.raises(DataError) as exc:
        load_amex(amex_root)
    assert exc.value.field == "bbox" and "ep_a_0.json" in exc.value.file
