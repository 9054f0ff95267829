"""Reader for AndroidControl's GZIP TFRecord shards (one ``tf.train.Example`` episode each), without TensorFlow.

Scroll directions are reversed from the content's into the finger's; click coordinates are pixels of the
step's screenshot; targets come from the accessibility tree. Screenshots are written once into a cache folder
(``<root>/screenshot_cache`` by default) and steps keep paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from google.protobuf.message import DecodeError
from tfrecord import example_pb2

from ipl_jax.coat.actions import Action
from ipl_jax.data.a11y import a11y_elements, click_target
from ipl_jax.data.aitz import with_history
from ipl_jax.data.records import DataError, Episode, Step
from ipl_jax.data.tfrecords import iter_tfrecords

SPLITS = ("train", "validation", "test")
SUBSPLITS = ("IDD", "app_unseen", "task_unseen", "category_unseen")
FINGER_OF_CONTENT = {"up": "down", "down": "up", "left": "right", "right": "left"}
CONTENT_OF_FINGER = {finger: content for content, finger in FINGER_OF_CONTENT.items()}
# keyboard_enter: AndroidWorld's name for the enter key, which AndroidControl's own episodes never hold; the
# synthetic world's AndroidControl writer uses it for press enter (envs/synthetic/android_control_writer.py)
_NAV = {"navigate_home": "home", "navigate_back": "back", "keyboard_enter": "enter"}


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
    split: str | None,
    subsplits: dict,
    high_level: bool,
    keep_elements: bool,
    wanted=None,
) -> Episode | None:
    """One serialized ``tf.train.Example`` as an episode, its screenshots written to ``cache_dir``.

    None when ``wanted`` (a set of episode ids) does not hold it. Raises ``DataError``.
    """
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
        return _episode_from_example(
            ex, episode_id, file, index, cache_dir, split, subsplits, high_level, keep_elements
        )
    except DataError as err:
        err.episode_id = episode_id  # lets the loader tell "malformed" from "missing"
        raise


@dataclasses.dataclass(frozen=True)
class _EpisodeFeatures:
    """One episode's raw features, checked against each other: n screenshots, n - 1 actions."""

    goal: str
    shots: list
    widths: list
    heights: list
    actions: list
    step_texts: list | None
    trees: list | None


def _episode_features(ex, where) -> _EpisodeFeatures:
    """Read and check an episode's features: one goal, at least 2 screenshots with positive sizes, and per-step
    lists whose lengths match the screenshots (a malformed one is a one-line ``DataError``)."""
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
        ("screenshot_widths", widths, n),
        ("screenshot_heights", heights, n),
        ("actions", actions, n - 1),
        ("step_instructions", step_texts, n - 1),
        ("accessibility_trees", trees, n),
    ):
        if values is not None and len(values) != want:
            raise DataError(*where, key, f"{len(values)} entries for {n} screenshots (expected {want})")
    if any(v <= 0 for v in list(widths) + list(heights)):
        raise DataError(*where, "screenshot_widths", "non-positive screenshot size")
    return _EpisodeFeatures(goal, shots, widths, heights, actions, step_texts, trees)


def _step(f: _EpisodeFeatures, i: int, action: Action, meta: dict, cache_dir, where, high_level, keep_elements):
    """Step ``i`` of the episode: its click target from the accessibility tree (an unreadable tree is noted in
    ``meta``, the step kept) and its screenshot written to the cache."""
    w, h = int(f.widths[i]), int(f.heights[i])
    elements = ()
    if f.trees is not None and (keep_elements or action.type in ("click", "long_press")):
        try:
            elements = a11y_elements(f.trees[i], w, h)
        except DecodeError as e:  # the tree is an aid, not the label: keep the step
            meta["a11y_error"] = str(e)
    if action.type in ("click", "long_press"):
        box, text = click_target(elements, action.point)
        action = dataclasses.replace(action, box=box, target=text)
    image = _cache_screenshot(f.shots[i], cache_dir, meta["episode_id"], i, where)
    return Step(
        episode_id=meta["episode_id"],
        step_id=i,
        instruction=f.goal,
        image=str(image),
        screen_size=(w, h),
        action=action,
        elements=elements if keep_elements else (),
        step_instruction=None if high_level else meta["step_instruction"],
        meta=meta,
    )


def _episode_from_example(ex, episode_id, file, index, cache_dir, split, subsplits, high_level, keep_elements):
    where = (file, f"{index} (episode {episode_id})")
    f = _episode_features(ex, where)
    n = len(f.shots)
    subsplit_names = tuple(sorted(s for s, members in subsplits.items() if episode_id in members))
    # Validate every action before writing anything to the cache.
    parsed_actions = [
        _action(f.actions[i], int(f.widths[i]), int(f.heights[i]), (file, f"{index} (episode {episode_id}, step {i})"))
        for i in range(n - 1)
    ]
    steps = []
    for i, action in enumerate(parsed_actions):
        meta = {
            "dataset": "android_control",
            "episode_id": episode_id,
            "step_id": i,
            "split": split,
            "subsplits": subsplit_names,
            "file": str(file),
            "record": index,
            "step_instruction": _text(f.step_texts[i]) if f.step_texts is not None else None,
        }
        steps.append(_step(f, i, action, meta, cache_dir, where, high_level, keep_elements))
    return Episode(
        episode_id=episode_id,
        instruction=f.goal,
        steps=with_history(steps),
        meta={
            "dataset": "android_control",
            "split": split,
            "subsplits": steps[0].meta["subsplits"],
            "file": str(file),
            "record": index,
        },
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
    """The TFRecord shards under ``root``: ``*-of-*`` files, sorted; hidden files (shards being written) excluded."""
    return sorted(
        p
        for p in root.iterdir()
        if p.is_file() and "-of-" in p.name and not p.name.endswith(".json") and not p.name.startswith(".")
    )


def load_android_control_with_report(
    root: str | Path,
    split: str,
    subsplit: str | None = None,
    high_level: bool = True,
    cache_dir: str | Path | None = None,
    skip_bad: bool = False,
    keep_elements: bool = False,
) -> tuple[list[Episode], list[DataError]]:
    """Load one split (optionally a test subsplit) in one streaming pass; also return the skipped records.

    ``high_level=False`` puts the low-level instruction in ``Step.step_instruction``; ``keep_elements`` keeps the
    a11y nodes. A malformed or missing episode raises ``DataError`` unless ``skip_bad``.
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
                        payload,
                        shard,
                        index,
                        cache_dir=cache,
                        split=split,
                        subsplits=subsplits,
                        high_level=high_level,
                        keep_elements=keep_elements,
                        wanted=wanted,
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


def load_android_control(root: str | Path, split: str, subsplit: str | None = None, **options) -> list[Episode]:
    """Load one AndroidControl split as episodes; options as in ``load_android_control_with_report``."""
    return load_android_control_with_report(root, split, subsplit, **options)[0]
