"""AITZ reader on fixture episodes written in the published layout (string-encoded JSON fields, [y, x] points,
[top, left, height, width] pixel boxes, one PNG per step)."""

import json
from pathlib import Path

import pytest
from PIL import Image

from ipl_jax.coat.actions import Action
from ipl_jax.data.aitz import load_aitz, load_aitz_with_report
from ipl_jax.data.records import CoaT, DataError

W, H = 270, 600  # the published sample PNG size


def _record(
    ep_id,
    subset,
    step_id,
    n,
    image_rel,
    action_type,
    touch=(-1.0, -1.0),
    lift=(-1.0, -1.0),
    text="",
    positions=(),
    ui_text=(),
    ui_types=(),
    instruction="open the settings",
):
    return {
        "episode_id": ep_id,
        "episode_length": n,
        "step_id": step_id,
        "instruction": instruction,
        "image_path": image_rel,
        "ui_positions": json.dumps([list(p) for p in positions]),
        "ui_text": json.dumps(list(ui_text)),
        "ui_types": json.dumps(list(ui_types)),
        "result_action_type": action_type,
        "result_touch_yx": json.dumps(list(touch)),
        "result_lift_yx": json.dumps(list(lift)),
        "result_action_text": text,
        "coat_screen_desc": f"screen {step_id}",
        "coat_action_think": f"think {step_id}",
        "coat_action_desc": f"desc {step_id}",
        "coat_action_result": f"result {step_id}",
    }


def write_episode(split_dir: Path, subset: str, ep_id: str, steps: list[dict], size=(W, H), image_prefix=None):
    """Write one episode folder. ``steps`` hold the record fields except ids and image paths."""
    name = f"{subset.upper()}-{ep_id}"
    ep_dir = split_dir / subset / name
    ep_dir.mkdir(parents=True)
    records = []
    for i, kw in enumerate(steps):
        png = ep_dir / f"{name}_{i}.png"
        Image.new("RGB", size, (i * 20 % 255, 90, 160)).save(png)
        rel = f"{subset}/{name}/{png.name}" if image_prefix is None else f"{image_prefix}/{png.name}"
        records.append(_record(ep_id, subset, i, len(steps), rel, **kw))
    (ep_dir / f"{name}.json").write_text(json.dumps(records))
    return ep_dir / f"{name}.json"


# Element boxes as [top, left, height, width] in pixels of a 270×600 PNG.
OUTER = [100, 0, 200, 270]  # x 0..1, y 100/600..300/600
INNER = [150, 27, 60, 54]  # x 0.1..0.3, y 0.25..0.35


@pytest.fixture()
def aitz_root(tmp_path):
    split = tmp_path / "train"
    elements = dict(positions=[OUTER, INNER], ui_text=["list", "Wi-Fi"], ui_types=["TEXT", "ICON_WIFI"])
    write_episode(
        split,
        "general",
        "1001",
        [
            # tap: touch (x=0.2, y=0.3), lift 0.03 away -> click on INNER (smallest box containing it)
            dict(action_type=4, touch=(0.30, 0.20), lift=(0.33, 0.20), **elements),
            # |dy| = 0.28 >= 0.9 * |dx| = 0.27 -> vertical; finger moves up (lift_y < touch_y)
            dict(action_type=4, touch=(0.80, 0.20), lift=(0.52, 0.50), **elements),
            # mostly horizontal, finger moves left
            dict(action_type=4, touch=(0.50, 0.90), lift=(0.55, 0.10)),
            dict(action_type=4, touch=(0.20, 0.50), lift=(0.90, 0.50)),  # finger moves down
            dict(action_type=3, text="wifi settings"),
            dict(action_type=5),
            dict(action_type=6),
            dict(action_type=7),
            # tap outside every box -> no target
            dict(action_type=4, touch=(0.95, 0.95), lift=(0.95, 0.95), **elements),
            dict(action_type=10),
        ],
    )
    # An episode whose image_path has another prefix and whose PNGs are twice the sample size.
    write_episode(
        split,
        "google_apps",
        "2002",
        [
            _tap((0.5, 0.5), {"Search": [300, 270, 600, 270]}),
            dict(action_type=11),
        ],
        size=(540, 1200),
        image_prefix="android_in_the_zoo/train/google_apps/GOOGLE_APPS-2002",
    )
    return tmp_path


def _tap(point: tuple[float, float], texts: dict) -> dict:
    """An AITZ tap record at ``point`` (y, x) on a screen of TEXT elements: text -> its position [y, x, h, w]."""
    return dict(
        action_type=4,
        touch=point,
        lift=point,
        positions=list(texts.values()),
        ui_text=list(texts),
        ui_types=["TEXT"] * len(texts),
    )


def test_actions_boxes_and_history(aitz_root):
    eps = load_aitz(aitz_root, "train")
    assert [e.episode_id for e in eps] == ["1001", "2002"]
    ep = eps[0]
    s = ep.steps
    assert len(s) == 10 and ep.instruction == "open the settings"
    assert s[0].screen_size == (W, H)

    # Boxes: [top, left, height, width] px -> (x1, y1, x2, y2) fractions of the PNG's own size.
    assert s[0].elements[0].box == pytest.approx((0.0, 100 / 600, 1.0, 300 / 600))
    assert s[0].elements[1].box == pytest.approx((0.1, 0.25, 0.3, 0.35))
    assert s[0].elements[1].text == "Wi-Fi" and s[0].elements[1].kind == "ICON_WIFI"

    click = s[0].action
    assert click.type == "click"
    assert click.point == pytest.approx((0.2, 0.3))  # [y, x] -> (x, y), from the touch point
    assert click.box == pytest.approx((0.1, 0.25, 0.3, 0.35))  # the smaller of the two containing boxes
    assert click.target == "Wi-Fi"

    assert s[1].action == Action(type="scroll", direction="up")
    assert s[2].action == Action(type="scroll", direction="left")
    assert s[3].action == Action(type="scroll", direction="down")
    assert s[4].action == Action(type="type", text="wifi settings")
    assert [s[i].action.button for i in (5, 6, 7)] == ["back", "home", "enter"]
    assert s[8].action.type == "click" and s[8].action.box is None and s[8].action.target is None
    assert s[8].action.point == pytest.approx((0.95, 0.95))
    assert s[9].action == Action(type="stop")

    assert s[0].history == ()
    assert s[3].history == ("click Wi-Fi", "scroll up", "scroll left")
    assert s[9].history[-2:] == ("press enter", "click the element")

    assert s[2].coat == CoaT("screen 2", "think 2", "desc 2", "result 2")
    assert s[4].meta["subset"] == "general" and s[4].meta["episode_id"] == "1001" and s[4].meta["step_id"] == 4


def test_own_png_size_and_image_path_fallback(aitz_root):
    ep = load_aitz(aitz_root, "train")[1]
    s0, s1 = ep.steps
    assert s0.screen_size == (540, 1200)
    # [300, 270, 600, 270] px of a 540×1200 PNG
    assert s0.elements[0].box == pytest.approx((0.5, 0.25, 1.0, 0.75))
    assert s0.action.box == pytest.approx((0.5, 0.25, 1.0, 0.75)) and s0.action.target == "Search"
    assert Path(s0.image).name == "GOOGLE_APPS-2002_0.png" and Path(s0.image).is_file()
    assert s0.load_image().size == (540, 1200)
    assert s1.action == Action(type="stop", status="impossible")
    assert s0.meta["subset"] == "google_apps"


def test_malformed_record_raises_and_skips(aitz_root):
    split = aitz_root / "train"
    f = write_episode(
        split,
        "install",
        "3003",
        [
            dict(action_type=5),
            dict(action_type=6),
            dict(action_type=10),
        ],
    )
    records = json.loads(f.read_text())
    records[1]["ui_positions"] = "[[1, 2, 3"  # broken JSON inside the string
    f.write_text(json.dumps(records))

    with pytest.raises(DataError) as exc:
        load_aitz(aitz_root, "train")
    assert exc.value.file == str(f) and exc.value.record == 1 and exc.value.field == "ui_positions"
    assert "INSTALL-3003.json" in str(exc.value)

    eps, skipped = load_aitz_with_report(aitz_root, "train", skip_bad=True)
    assert len(skipped) == 1 and skipped[0].field == "ui_positions"
    assert len(eps) == 3 and sum(len(e.steps) for e in eps) == 10 + 2 + 2  # nothing else lost
    bad_ep = [e for e in eps if e.episode_id == "3003"][0]
    assert [s.step_id for s in bad_ep.steps] == [0, 2]
    assert bad_ep.steps[1].meta.get("history_gap") is True and "history_gap" not in bad_ep.steps[0].meta


@pytest.mark.parametrize(
    "field,value,problem",
    [
        ("result_action_type", 9, "unknown action code"),
        ("result_touch_yx", "[0.5]", "expected [y, x]"),
        ("ui_text", json.dumps(["only one"]), "entries but ui_positions has 2"),
        ("image_path", "general/nowhere/missing.png", "not found"),
    ],
)
def test_each_malformed_field_is_named(tmp_path, field, value, problem):
    f = write_episode(
        tmp_path / "test",
        "general",
        "7",
        [
            _tap((0.3, 0.2), {"a": OUTER, "b": INNER}),
        ],
    )
    records = json.loads(f.read_text())
    records[0][field] = value
    f.write_text(json.dumps(records))
    with pytest.raises(DataError) as exc:
        load_aitz(tmp_path, "test")
    assert exc.value.field == field and problem in exc.value.problem
