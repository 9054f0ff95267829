"""AndroidControl reader on fixture shards written as published: GZIP TFRecords of tf.train.Example (written
with the ``tfrecord`` package's writer, then gzipped), splits.json and test_subsplits.json, accessibility
forests encoded by hand in protobuf wire format with android_env's field numbers."""

import gzip
import io
import json
import shutil
import struct
from pathlib import Path

import pytest
from PIL import Image
from tfrecord.writer import TFRecordWriter

from ipl_jax.coat.actions import Action
from ipl_jax.data.android_control import load_android_control, load_android_control_with_report
from ipl_jax.data.records import DataError
from ipl_jax.data.tfrecords import iter_tfrecords, masked_crc

# ---------------------------------------------------------------------------------------------- protobuf wire


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def a11y_node(uid, ltrb, text="", cls="android.widget.TextView", clickable=False, desc=""):
    rect = b"".join(_field_varint(i, v) for i, v in enumerate(ltrb, 1))
    out = _field_varint(1, uid) + _field_bytes(2, rect) + _field_bytes(3, cls.encode())
    if desc:
        out += _field_bytes(4, desc.encode())
    out += _field_bytes(6, b"com.android.settings")  # package_name: not read, must be skipped
    if text:
        out += _field_bytes(7, text.encode())
    if clickable:
        out += _field_varint(14, 1)
    out += _field_bytes(24, _field_varint(1, 16) + _field_bytes(2, b"click"))  # actions: skipped
    out += _field_bytes(25, _varint(uid + 1) + _varint(uid + 2))  # packed child_ids: skipped
    return out


def a11y_forest(nodes) -> bytes:
    tree = b"".join(_field_bytes(1, n) for n in nodes)
    window = _field_bytes(1, _field_varint(3, 270)) + _field_varint(6, 1) + _field_bytes(11, tree)
    return _field_bytes(1, window)


# ---------------------------------------------------------------------------------------------- fixture


def png_bytes(w, h, shade=0) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (shade, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


def example(ep_id, goal, actions, sizes, step_texts=None, trees=None):
    n = len(actions) + 1
    return {
        "episode_id": ([ep_id], "int"),
        "goal": ([goal.encode()], "byte"),
        "screenshots": ([png_bytes(*sizes[i], i * 40) for i in range(n)], "byte"),
        "screenshot_widths": ([sizes[i][0] for i in range(n)], "int"),
        "screenshot_heights": ([sizes[i][1] for i in range(n)], "int"),
        "accessibility_trees": (trees or [a11y_forest([]) for _ in range(n)], "byte"),
        "actions": ([json.dumps(a).encode() for a in actions], "byte"),
        "step_instructions": ([t.encode() for t in (step_texts or [f"step {i}" for i in range(n - 1)])], "byte"),
    }


def write_shard(path: Path, examples, corrupt_payload_of=None, truncate_to=None):
    """TFRecordWriter writes the raw records; the file is then gzipped like the published shards."""
    raw = path.with_suffix(".raw")
    writer = TFRecordWriter(str(raw))
    for ex in examples:
        writer.write(ex)
    writer.close()
    data = bytearray(raw.read_bytes())
    raw.unlink()
    if corrupt_payload_of is not None:  # flip one byte inside record k's payload: its data crc fails
        pos = 0
        for _ in range(corrupt_payload_of):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            pos += 16 + length
        data[pos + 12 + 5] ^= 0xFF
    if truncate_to is not None:
        data = data[:truncate_to]
    with gzip.open(path, "wb") as f:
        f.write(bytes(data))


SMALL = (270, 600)
LARGE = (540, 1200)

# Episode 101: a clickable row without text holding a text child; the big container is not clickable.
TREE_101 = a11y_forest(
    [
        a11y_node(0, (0, 0, 270, 600), cls="android.widget.FrameLayout"),
        a11y_node(1, (0, 120, 270, 180), cls="android.widget.LinearLayout", clickable=True),
        a11y_node(2, (20, 130, 150, 170), text="Wi-Fi"),
    ]
)
EPISODES = {
    101: example(
        101,
        "turn on wifi",
        [
            {"action_type": "click", "x": 54, "y": 150},
            {"action_type": "scroll", "direction": "down"},  # content moves down = finger moves up
            {"action_type": "input_text", "text": "hello"},
        ],
        [SMALL] * 4,
        step_texts=["tap wifi", "scroll", "type hello"],
        trees=[TREE_101, a11y_forest([]), a11y_forest([]), a11y_forest([])],
    ),
    202: example(
        202,
        "send a mail",
        [
            {"action_type": "long_press", "x": 270, "y": 600},
            {"action_type": "open_app", "app_name": "Gmail"},
            {"action_type": "navigate_back"},
            {"action_type": "navigate_home"},
            {"action_type": "wait"},
            {"action_type": "scroll", "direction": "left"},
        ],
        [LARGE] * 7,
    ),
    303: example(303, "go back", [{"action_type": "scroll", "direction": "right"}], [SMALL, SMALL]),
    404: example(404, "validate", [{"action_type": "wait"}], [SMALL, SMALL]),
}


@pytest.fixture()
def ac_root(tmp_path):
    write_shard(tmp_path / "android_control-00000-of-00002", [EPISODES[101], EPISODES[202]])
    write_shard(tmp_path / "android_control-00001-of-00002", [EPISODES[303], EPISODES[404]])
    (tmp_path / "splits.json").write_text(json.dumps({"train": [101], "validation": [404], "test": [202, 303]}))
    (tmp_path / "test_subsplits.json").write_text(
        json.dumps({"IDD": [202], "app_unseen": [202], "task_unseen": [303], "category_unseen": []})
    )
    return tmp_path


# ---------------------------------------------------------------------------------------------- tests


def test_masked_crc_known_answer():
    crc = 0xE3069283  # CRC32C("123456789"), the standard check value
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc(b"123456789") == struct.pack("<I", masked)


def test_train_episode(ac_root):
    (ep,) = load_android_control(ac_root, "train")
    assert ep.episode_id == "101" and ep.instruction == "turn on wifi" and len(ep.steps) == 3
    s = ep.steps
    click = s[0].action
    assert click.type == "click" and click.point == pytest.approx((0.2, 0.25))
    assert click.box == pytest.approx((0.0, 0.2, 1.0, 0.3))  # the clickable row, not the container
    assert click.target == "Wi-Fi"  # the row has no text: its text child names it
    assert s[1].action == Action(type="scroll", direction="up")
    assert s[2].action == Action(type="type", text="hello")
    assert s[2].history == ("click Wi-Fi", "scroll up")
    assert s[0].step_instruction is None and s[0].meta["step_instruction"] == "tap wifi"
    assert s[0].meta["subsplits"] == () and s[0].screen_size == SMALL and s[0].elements == ()
    # Screenshots went to the default cache next to the data; the final screenshot has no step.
    assert Path(s[0].image).parent == ac_root / "screenshot_cache" / "101"
    assert s[2].load_image().getpixel((0, 0)) == (80, 120, 200)
    # Only the selected split's screenshots were written.
    assert sorted(p.name for p in (ac_root / "screenshot_cache").iterdir()) == ["101"]

    low = load_android_control(ac_root, "train", high_level=False, keep_elements=True)[0]
    assert [st.step_instruction for st in low.steps] == ["tap wifi", "scroll", "type hello"]
    assert [e.text for e in low.steps[0].elements] == ["", "", "Wi-Fi"]
    assert low.steps[0].elements[1].clickable and not low.steps[0].elements[0].clickable


def test_test_split_subsplits_and_cache(ac_root, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    eps = load_android_control(ac_root, "test", cache_dir=cache)
    assert [e.episode_id for e in eps] == ["202", "303"]
    s = eps[0].steps
    assert s[0].action.type == "long_press" and s[0].action.point == pytest.approx((0.5, 0.5))
    assert s[0].action.box is None and s[0].action.target is None  # no node contains the point
    assert s[1].action == Action(type="open_app", text="Gmail")
    assert [s[i].action.button for i in (2, 3)] == ["back", "home"]
    assert s[4].action == Action(type="wait")
    assert s[5].action == Action(type="scroll", direction="right")
    assert eps[1].steps[0].action == Action(type="scroll", direction="left")
    assert s[0].meta["subsplits"] == ("IDD", "app_unseen") and eps[1].meta["subsplits"] == ("task_unseen",)
    assert s[0].screen_size == LARGE and Path(s[0].image).parent == cache / "202"

    before = Path(s[0].image).stat().st_mtime_ns
    again = load_android_control(ac_root, "test", subsplit="task_unseen", cache_dir=cache)
    assert [e.episode_id for e in again] == ["303"]
    assert Path(s[0].image).stat().st_mtime_ns == before  # cached screenshots are not rewritten
    with pytest.raises(ValueError, match="test split only"):
        load_android_control(ac_root, "train", subsplit="IDD")
    assert [e.episode_id for e in load_android_control(ac_root, "validation")] == ["404"]


def test_malformed_and_corrupt_records(ac_root):
    bad_action = example(505, "bad", [{"action_type": "scroll", "direction": "sideways"}], [SMALL, SMALL])
    good = example(606, "good", [{"action_type": "wait"}], [SMALL, SMALL])
    corrupt = example(707, "corrupt", [{"action_type": "wait"}], [SMALL, SMALL])
    extra = ac_root / "android_control-00002-of-00002"
    write_shard(extra, [bad_action, good, corrupt], corrupt_payload_of=2)
    (ac_root / "splits.json").write_text(
        json.dumps({"train": [101, 505, 606, 707], "validation": [404], "test": [202, 303]})
    )

    with pytest.raises(DataError) as exc:
        load_android_control(ac_root, "train")
    assert exc.value.file == str(extra) and exc.value.field == "actions" and "sideways" in exc.value.problem

    eps, skipped = load_android_control_with_report(ac_root, "train", skip_bad=True)
    assert [e.episode_id for e in eps] == ["101", "606"]
    assert [(Path(e.file).name, e.field) for e in skipped] == [
        (extra.name, "actions"),  # malformed episode 505
        (extra.name, "<framing>"),  # record 2: data crc mismatch
        ("splits.json", "train"),  # so 707 is listed but found nowhere
    ]
    assert skipped[1].record == 2 and "crc" in skipped[1].problem and skipped[2].record == "707"


def test_truncated_shard(ac_root):
    shard = ac_root / "android_control-00001-of-00002"
    with gzip.open(shard, "rb") as f:
        raw_len = len(f.read())
    write_shard(shard, [EPISODES[303], EPISODES[404]], truncate_to=raw_len - 10)
    with pytest.raises(DataError) as exc:
        list(iter_tfrecords(shard))
    assert exc.value.record == 1 and "truncated" in exc.value.problem
    eps, skipped = load_android_control_with_report(ac_root, "test", skip_bad=True)
    # The broken tail cannot be attributed to an episode, so it is reported whatever the split.
    assert [e.episode_id for e in eps] == ["202", "303"] and [e.field for e in skipped] == ["<framing>"]
    eps, skipped = load_android_control_with_report(ac_root, "validation", skip_bad=True)
    assert eps == [] and [e.field for e in skipped] == ["<framing>", "validation"]
    # A file that is not gzip at all names the shard too.
    shutil.copy(ac_root / "splits.json", shard)
    with pytest.raises(DataError, match="00001-of-00002"):
        load_android_control(ac_root, "test")
