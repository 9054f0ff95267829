"""Reader for AndroidControl: GZIP TFRecord shards of ``tf.train.Example``, read without TensorFlow.

Layout under ``root``: the shards (``android_control-000NN-of-00020``), ``splits.json`` (``train``,
``validation``, ``test`` → episode ids) and ``test_subsplits.json`` (``IDD``, ``app_unseen``, ``task_unseen``,
``category_unseen`` → test episode ids; they overlap).

One record is one episode: ``episode_id`` (int64), ``goal`` (bytes), ``screenshots`` (N PNGs),
``screenshot_widths`` / ``screenshot_heights`` (N int64), ``accessibility_trees`` (N serialized
``AndroidAccessibilityForest`` protos), ``actions`` (N−1 JSON strings) and ``step_instructions`` (N−1). Step i
pairs screenshot i with action i; the last screenshot has no action.

Traps honoured here:

* a scroll's ``direction`` is the direction the *content* moves; it is reversed into the finger direction;
* click / long_press ``x``, ``y`` are pixels of that step's screenshot (normalised by its own width/height);
* the screenshots of the real set are tens of GB: one streaming pass writes each PNG, untouched, into a cache
  folder (``<root>/screenshot_cache`` unless ``cache_dir`` is given) and the steps keep only paths. A file
  already in the cache with the same size is not written again.

Framing is read here (``uint64 length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data)``) so that
both checksums are verified and a broken record names its shard and index; the ``tf.train.Example`` and the
CRC come from the ``tfrecord`` package. The click target box and text come from the accessibility tree (the
smallest clickable node containing the point), parsed with a partial copy of android_env's a11y schema.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Iterator, Optional, Sequence

from tfrecord import example_pb2
from tfrecord.writer import TFRecordWriter

from ipl_jax.coat.actions import Action
from ipl_jax.data.aitz import box_area, box_contains, pixel_box_to_fractions, with_history
from ipl_jax.data.records import DataError, Episode, Step, UIElement

SPLITS = ("train", "validation", "test")
SUBSPLITS = ("IDD", "app_unseen", "task_unseen", "category_unseen")
FINGER_OF_CONTENT = {"up": "down", "down": "up", "left": "right", "right": "left"}
_NAV = {"navigate_home": "home", "navigate_back": "back"}


# ---------------------------------------------------------------------------------------------- framing


def masked_crc(data: bytes) -> bytes:
    """TFRecord's masked CRC32C of ``data`` as 4 little-endian bytes."""
    return TFRecordWriter.masked_crc(bytes(data))


def iter_tfrecords(
    path: str | Path, compression: Optional[str] = "gzip"
) -> Iterator[tuple[int, Optional[bytes], Optional[DataError]]]:
    """Yield ``(index, payload, None)`` for each record of a TFRecord file, verifying both checksums.

    A record whose data checksum fails is yielded as ``(index, None, DataError)``: the stream stays readable,
    so the caller may skip it and go on. Any other framing error (bad length checksum, truncation, broken
    gzip) ends the file and is raised as ``DataError(path, index, "<framing>", ...)``.
    """
    path = Path(path)
    opener = gzip.open if compression == "gzip" else open
    index = 0
    try:
        with opener(path, "rb") as f:
            while True:
                head = f.read(12)
                if not head:
                    return
                if len(head) != 12:
                    raise DataError(path, index, "<framing>", "truncated record header")
                length_bytes, length_crc = head[:8], head[8:]
                if masked_crc(length_bytes) != length_crc:
                    raise DataError(path, index, "<framing>", "length crc mismatch (rest of file unreadable)")
                (length,) = struct.unpack("<Q", length_bytes)
                payload = f.read(length)
                data_crc = f.read(4)
                if len(payload) != length or len(data_crc) != 4:
                    raise DataError(path, index, "<framing>", "truncated record")
                if masked_crc(payload) != data_crc:
                    yield index, None, DataError(path, index, "<framing>", "data crc mismatch")
                else:
                    yield index, payload, None
                index += 1
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(path, index, "<framing>", f"unreadable {compression or 'raw'} stream: {e}") from None


# ---------------------------------------------------------------------------------------------- a11y trees


def _a11y_forest_class():
    """A message class for android_env's ``AndroidAccessibilityForest`` holding only the fields read here.

    Field numbers follow android_env/proto/a11y/*.proto; every other field is skipped by the parser.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="ipl_jax_a11y.proto", package="ipl_jax_a11y", syntax="proto3")

    def message(name, fields):
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".ipl_jax_a11y." + type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Rect", [(n, i, F.TYPE_INT32, opt, None) for i, n in enumerate(("left", "top", "right", "bottom"), 1)])
    message("Node", [
        ("bounds_in_screen", 2, F.TYPE_MESSAGE, opt, "Rect"),
        ("class_name", 3, F.TYPE_STRING, opt, None),
        ("content_description", 4, F.TYPE_STRING, opt, None),
        ("text", 7, F.TYPE_STRING, opt, None),
        ("view_id_resource_name", 10, F.TYPE_STRING, opt, None),
        ("is_clickable", 14, F.TYPE_BOOL, opt, None),
        ("is_long_clickable", 19, F.TYPE_BOOL, opt, None),
        ("is_scrollable", 21, F.TYPE_BOOL, opt, None),
    ])
    message("Tree", [("nodes", 1, F.TYPE_MESSAGE, rep, "Node")])
    message("Window", [("tree", 11, F.TYPE_MESSAGE, opt, "Tree")])
    message("Forest", [("windows", 1, F.TYPE_MESSAGE, rep, "Window")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ipl_jax_a11y.Forest"))


_FOREST = None


def a11y_elements(forest_bytes: bytes, width: int, height: int) -> tuple[UIElement, ...]:
    """The nodes of a serialized accessibility forest with a non-empty box, boxes in screen fractions.

    ``kind`` is the node's class name; ``text`` its text, else its content description. Raises
    ``google.protobuf.message.DecodeError`` when the bytes do not parse.
    """
    global _FOREST
    if _FOREST is None:
        _FOREST = _a11y_forest_class()
    forest = _FOREST.FromString(forest_bytes)
    out = []
    for window in forest.windows:
        for node in window.tree.nodes:
            r = node.bounds_in_screen
            if r.right <= r.left or r.bottom <= r.top:
                continue
            out.append(
                UIElement(
                    box=pixel_box_to_fractions(r.left, r.top, r.right, r.bottom, width, height),
                    text=(node.text or node.content_description).strip(),
                    kind=node.class_name,
                    clickable=node.is_clickable or node.is_long_clickable,
                )
            )
    return tuple(out)


def click_target(elements: Sequence[UIElement], point) -> tuple[Optional[tuple], Optional[str]]:
    """(box, text) of the smallest clickable element containing ``point`` (any element if none is clickable).

    When that element has no text, the text of the smallest text-bearing element inside it that contains the
    point is used (a clickable row often carries its label on a child).
    """
    containing = [e for e in elements if box_contains(e.box, point)]
    if not containing:
        return None, None
    pool = [e for e in containing if e.clickable] or containing
    best = min(pool, key=lambda e: box_area(e.box))
    text = best.text
    if not text:
        inner = [
            e for e in containing
            if e.text and e.box[0] >= best.box[0] and e.box[1] >= best.box[1]
            and e.box[2] <= best.box[2] and e.box[3] <= best.box[3]
        ]
        if inner:
            text = min(inner, key=lambda e: box_area(e.box)).text
    return best.box, (text or None)


# ---------------------------------------------------------------------------------------------- one episode


def _feature(ex, key: str, kind: str, where, required: bool = True):
    feats = ex.features.feature
    if key not in feats:
        if required:
            raise DataError(*where, key, "missing")
        return None
    f = feats[key]
    which = f.WhichOneof("kind")
    if which is None:  # an empty list
        return []
    if which != kind:
        raise DataError(*where, key, f"expected {kind}, got {which}")
    return list(getattr(f, kind).value)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _action(raw: bytes, width: int, height: int, where) -> Action:
    """One action JSON as an Action; a click's target box and text are filled in later from the a11y tree."""
    try:
        a = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(*where, "actions", f"not valid JSON: {e}") from None
    if not isinstance(a, dict):
        raise DataError(*where, "actions", f"expected an object, got {a!r}")
    kind = a.get("action_type")
    if kind in ("click", "long_press"):
        x, y = a.get("x"), a.get("y")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
            raise DataError(*where, "actions", f"{kind} without pixel x/y: {a!r}")
        if not (0 <= x <= width and 0 <= y <= height):
            raise DataError(*where, "actions", f"{kind} at ({x}, {y}) outside the {width}x{height} screenshot")
        return Action(type=kind, point=(x / width, y / height))
    if kind == "scroll":
        d = a.get("direction")
        if d not in FINGER_OF_CONTENT:
            raise DataError(*where, "actions", f"scroll direction {d!r}")
        return Action(type="scroll", direction=FINGER_OF_CONTENT[d])
    if kind == "open_app":
        name = a.get("app_name")
        if not isinstance(name, str) or not name:
            raise DataError(*where, "actions", f"open_app without app_name: {a!r}")
        return Action(type="open_app", text=name)
    if kind == "input_text":
        text = a.get("text")
        if not isinstance(text, str):
            raise DataError(*where, "actions", f"input_text without text: {a!r}")
        return Action(type="type", text=text)
    if kind in _NAV:
        return Action(type="press", button=_NAV[kind])
    if kind == "wait":
        return Action(type="wait")
    raise DataError(*where, "actions", f"unknown action_type {kind!r}")


_IMAGE_SUFFIX = {b"\x89PNG\r\n\x1a\n": ".png", b"\xff\xd8\xff": ".jpg"}


def _cache_screenshot(data: bytes, cache_dir: Path, episode_id: str, i: int, where) -> Path:
    suffix = next((s for sig, s in _IMAGE_SUFFIX.items() if data.startswith(sig)), None)
    if suffix is None:
        raise DataError(*where, "screenshots", f"screenshot {i} is neither PNG nor JPEG")
    path = cache_dir / episode_id / f"{i}{suffix}"
    if path.is_file() and path.stat().st_size == len(data):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def parse_episode(
    payload: bytes,
    file: Path,
    index: int,
    *,
    cache_dir: Path,
    split: Optional[str],
    subsplits: dict,
    high_level: bool,
    keep_elements: bool,
    wanted=None,
) -> Optional[Episode]:
    """One serialized ``tf.train.Example`` as an episode, its screenshots written to ``cache_dir``.

    Returns None when ``wanted`` (a set of episode ids) does not hold the episode. Raises ``DataError``.
    """
    from google.protobuf.message import DecodeError

    where = (file, index)
    ex = example_pb2.Example()
    try:
        ex.ParseFromString(payload)
    except DecodeError as e:
        raise DataError(*where, "<example>", f"not a tf.train.Example: {e}") from None
    ids = _feature(ex, "episode_id", "int64_list", where)
    if len(ids) != 1:
        raise DataError(*where, "episode_id", f"expected one int64, got {ids!r}")
    episode_id = str(ids[0])
    if wanted is not None and episode_id not in wanted:
        return None
    try:
        return _episode_from_example(ex, episode_id, file, index, cache_dir, split, subsplits, high_level,
                                     keep_elements)
    except DataError as err:
        err.episode_id = episode_id  # lets the loader tell "malformed" from "missing"
        raise


def _episode_from_example(ex, episode_id, file, index, cache_dir, split, subsplits, high_level, keep_elements):
    from google.protobuf.message import DecodeError

    where = (file, f"{index} (episode {episode_id})")
    goal = _feature(ex, "goal", "bytes_list", where)
    if len(goal) != 1:
        raise DataError(*where, "goal", f"expected one string, got {len(goal)}")
    goal = _text(goal[0])
    shots = _feature(ex, "screenshots", "bytes_list", where)
    n = len(shots)
    if n < 2:
        raise DataError(*where, "screenshots", f"{n} screenshots: an episode needs at least 2")
    widths = _feature(ex, "screenshot_widths", "int64_list", where)
    heights = _feature(ex, "screenshot_heights", "int64_list", where)
    actions = _feature(ex, "actions", "bytes_list", where)
    step_texts = _feature(ex, "step_instructions", "bytes_list", where, required=False)
    trees = _feature(ex, "accessibility_trees", "bytes_list", where, required=False)
    for key, values, want in (
        ("screenshot_widths", widths, n), ("screenshot_heights", heights, n), ("actions", actions, n - 1),
        ("step_instructions", step_texts, n - 1), ("accessibility_trees", trees, n),
    ):
        if values is not None and len(values) != want:
            raise DataError(*where, key, f"{len(values)} entries for {n} screenshots (expected {want})")
    if any(v <= 0 for v in list(widths) + list(heights)):
        raise DataError(*where, "screenshot_widths", "non-positive screenshot size")

    subsplit_names = tuple(sorted(s for s, members in subsplits.items() if episode_id in members))
    # Validate every action before writing anything to the cache.
    parsed_actions = [
        _action(actions[i], int(widths[i]), int(heights[i]), (file, f"{index} (episode {episode_id}, step {i})"))
        for i in range(n - 1)
    ]
    steps = []
    for i, action in enumerate(parsed_actions):
        w, h = int(widths[i]), int(heights[i])
        meta = {
            "dataset": "android_control",
            "episode_id": episode_id,
            "step_id": i,
            "split": split,
            "subsplits": subsplit_names,
            "file": str(file),
            "record": index,
            "step_instruction": _text(step_texts[i]) if step_texts is not None else None,
        }
        elements = ()
        if trees is not None and (keep_elements or action.type in ("click", "long_press")):
            try:
                elements = a11y_elements(trees[i], w, h)
            except DecodeError as e:  # the tree is an aid, not the label: keep the step
                meta["a11y_error"] = str(e)
        if action.type in ("click", "long_press"):
            box, text = click_target(elements, action.point)
            action = dataclasses.replace(action, box=box, target=text)
        image = _cache_screenshot(shots[i], cache_dir, episode_id, i, (file, f"{index} (episode {episode_id})"))
        steps.append(
            Step(
                episode_id=episode_id,
                step_id=i,
                instruction=goal,
                image=str(image),
                screen_size=(w, h),
                action=action,
                elements=elements if keep_elements else (),
                step_instruction=None if high_level else meta["step_instruction"],
                meta=meta,
            )
        )
    return Episode(
        episode_id=episode_id,
        instruction=goal,
        steps=with_history(steps),
        meta={"dataset": "android_control", "split": split, "subsplits": steps[0].meta["subsplits"],
              "file": str(file), "record": index},
    )


# ---------------------------------------------------------------------------------------------- dataset


def _id_sets(path: Path, keys) -> dict[str, set[str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(path, "<file>", "<json>", f"unreadable: {e}") from None
    if not isinstance(data, dict):
        raise DataError(path, "<file>", "<json>", "expected an object of id lists")
    out = {}
    for k, v in data.items():
        if not isinstance(v, list):
            raise DataError(path, "<file>", k, "expected a list of episode ids")
        try:  # ids are int64 in the records; the JSON may hold them as numbers or digit strings
            out[k] = {str(int(e)) for e in v}
        except (TypeError, ValueError):
            raise DataError(path, "<file>", k, "episode ids must be integers") from None
    missing = [k for k in keys if k not in out]
    if missing:
        raise DataError(path, "<file>", missing[0], "missing")
    return out


def shard_files(root: Path) -> list[Path]:
    """The TFRecord shards under ``root``: files named ``*-of-*`` (the published naming), sorted."""
    return sorted(p for p in root.iterdir() if p.is_file() and "-of-" in p.name and not p.name.endswith(".json"))


def load_android_control_with_report(
    root: str | Path,
    split: str,
    subsplit: Optional[str] = None,
    high_level: bool = True,
    cache_dir: Optional[str | Path] = None,
    skip_bad: bool = False,
    keep_elements: bool = False,
) -> tuple[list[Episode], list[DataError]]:
    """Load one split (optionally one test subsplit); also return the skipped malformed records.

    One streaming pass over the shards: only the selected episodes are parsed into steps and have their
    screenshots written to the cache. ``high_level=False`` puts each step's low-level instruction in
    ``Step.step_instruction`` (it is always in ``meta["step_instruction"]``). ``keep_elements`` keeps the
    accessibility-tree nodes on each step (memory heavy on the full set). A malformed episode raises
    ``DataError`` (shard, record index, field); with ``skip_bad=True`` the episode is skipped and listed
    instead, as is an episode named by ``splits.json`` but found in no shard.
    """
    root = Path(root)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    splits = _id_sets(root / "splits.json", SPLITS)
    sub_file = root / "test_subsplits.json"
    subsplits = _id_sets(sub_file, ()) if sub_file.is_file() else {}
    wanted = set(splits[split])
    if subsplit is not None:
        if split != "test":
            raise ValueError(f"subsplit {subsplit!r} applies to the test split only")
        if subsplit not in subsplits:
            raise ValueError(f"subsplit {subsplit!r} not in {sub_file} (have {sorted(subsplits)})")
        wanted &= subsplits[subsplit]
    cache = Path(cache_dir) if cache_dir is not None else root / "screenshot_cache"
    shards = shard_files(root)
    if not shards:
        raise FileNotFoundError(f"no AndroidControl shards (*-of-*) under {root}")

    def bad(err: DataError):
        if not skip_bad:
            raise err
        skipped.append(err)

    episodes, skipped, found = [], [], set()
    for shard in shards:
        try:
            for index, payload, crc_error in iter_tfrecords(shard):
                if crc_error is not None:
                    bad(crc_error)
                    continue
                try:
                    ep = parse_episode(
                        payload, shard, index, cache_dir=cache, split=split, subsplits=subsplits,
                        high_level=high_level, keep_elements=keep_elements, wanted=wanted,
                    )
                except DataError as err:
                    if getattr(err, "episode_id", None) is not None:
                        found.add(err.episode_id)
                    bad(err)
                    continue
                if ep is not None:
                    if ep.episode_id in found:
                        bad(DataError(shard, index, "episode_id", f"episode {ep.episode_id} appears twice"))
                        continue
                    found.add(ep.episode_id)
                    episodes.append(ep)
        except DataError as err:  # framing broken: the rest of this shard is unreadable
            bad(err)
    for missing in sorted(wanted - found, key=lambda s: (len(s), s)):
        bad(DataError(root / "splits.json", missing, split, "episode listed but found in no shard"))
    episodes.sort(key=lambda e: (len(e.episode_id), e.episode_id))
    return episodes, skipped


def load_android_control(
    root: str | Path,
    split: str,
    subsplit: Optional[str] = None,
    high_level: bool = True,
    cache_dir: Optional[str | Path] = None,
    skip_bad: bool = False,
    keep_elements: bool = False,
) -> list[Episode]:
    """Load one AndroidControl split as episodes of steps; see ``load_android_control_with_report``."""
    return load_android_control_with_report(
        root, split, subsplit, high_level, cache_dir, skip_bad, keep_elements
    )[0]
