"""``ipl-jax synth`` output in the AITZ format: exact field types, gesture rules, and the round trip through
the AITZ reader."""

import json
import math
from pathlib import Path

import pytest

from ipl_jax.cli.synth import main as synth_main
from ipl_jax.envs.synthetic import generate_split

STRING_JSON = ("ui_positions", "ui_text", "ui_types", "result_touch_yx", "result_lift_yx")
FIELDS = {
    "episode_id": str,
    "episode_length": int,
    "step_id": int,
    "instruction": str,
    "image_path": str,
    "ui_positions": str,
    "ui_text": str,
    "ui_types": str,
    "result_action_type": int,
    "result_touch_yx": str,
    "result_lift_yx": str,
    "result_action_text": str,
    "coat_screen_desc": str,
    "coat_action_think": str,
    "coat_action_desc": str,
    "coat_action_result": str,
}
SPLIT, N, SEED = "test", 14, 5
CONFIG = ["width=252", "height=504", "p_start_home=0.3"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    rc = synth_main(
        [
            "--out",
            str(root),
            "--split",
            SPLIT,
            "--episodes",
            str(N),
            "--seed",
            str(SEED),
            "--world",
            *CONFIG,
            "--png-level",
            "1",
        ]
    )
    assert rc == 0
    from ipl_jax.envs.synthetic import WorldConfig, apply_overrides

    generated = generate_split(SPLIT, N, seed=SEED, config=apply_overrides(WorldConfig(), CONFIG))
    return root, generated


def test_layout_and_field_types(written):
    root, generated = written
    files = sorted((root / SPLIT).glob("*/*/*.json"))
    assert len(files) == N
    by_id = {e.episode_id: e for e in generated}
    for f in files:
        subset, folder = f.parent.parent.name, f.parent.name
        assert folder == f.stem and folder.startswith(subset.upper() + "-")
        records = json.loads(f.read_text(encoding="utf-8"))
        ep = by_id[folder.split("-", 1)[1]]
        assert isinstance(records, list) and len(records) == len(ep.steps)
        for k, rec in enumerate(records):
            assert set(rec) == set(FIELDS)
            for field, kind in FIELDS.items():
                assert type(rec[field]) is kind, (field, rec[field])
            assert rec["step_id"] == k and rec["episode_length"] == len(records)
            assert rec["episode_id"].isdigit() and f.name.startswith(subset.upper())
            png = root / SPLIT / rec["image_path"]
            assert png.is_file() and png.name == f"{folder}_{k}.png"
            from PIL import Image

            with Image.open(png) as img:
                assert img.size == (252, 504)
            decoded = {name: json.loads(rec[name]) for name in STRING_JSON}
            n_el = len(decoded["ui_positions"])
            assert n_el == len(decoded["ui_text"]) == len(decoded["ui_types"]) > 0
            for top, left, h, w in decoded["ui_positions"]:
                assert all(isinstance(v, int) for v in (top, left, h, w))
                assert 0 <= top and 0 <= left and h > 0 and w > 0 and top + h <= 504 and left + w <= 252
            touch, lift = decoded["result_touch_yx"], decoded["result_lift_yx"]
            a = ep.steps[k].action
            code = rec["result_action_type"]
            if a.type == "click":
                assert code == 4 and touch == lift == [a.point[1], a.point[0]]
            elif a.type == "scroll":
                dy, dx = lift[0] - touch[0], lift[1] - touch[1]
                assert code == 4 and math.hypot(dx, dy) >= 0.04
                finger = ("up" if dy < 0 else "down") if abs(dy) >= 0.9 * abs(dx) else ("left" if dx < 0 else "right")
                assert finger == a.direction
            else:
                assert touch == lift == [-1.0, -1.0]
                want = {"type": 3, "stop": 10}.get(a.type) or {"back": 5, "home": 6, "enter": 7}[a.button]
                assert code == want
            assert rec["result_action_text"] == (a.text if a.type == "type" else "")
            assert rec["coat_action_desc"] == ep.steps[k].coat.action_desc
    info = json.loads((root / SPLIT / "synth_info.json").read_text())
    assert info["episodes"] == N and info["steps"] == sum(len(e.steps) for e in generated)


def test_round_trip_through_the_aitz_reader(written):
    aitz = pytest.importorskip("ipl_jax.data.aitz")
    root, generated = written
    loaded = {e.episode_id: e for e in aitz.load_aitz(root, SPLIT)}
    assert set(loaded) == {e.episode_id for e in generated}
    px = 1.0 / 252 + 1e-9, 1.0 / 504 + 1e-9
    for gen in generated:
        got = loaded[gen.episode_id]
        assert got.instruction == gen.instruction and len(got.steps) == len(gen.steps)
        for s, t in zip(gen.steps, got.steps):
            assert t.screen_size == s.screen_size and t.history == s.history and t.coat == s.coat
            assert t.meta["subset"] == s.meta["subset"]
            assert len(t.elements) == len(s.elements)
            for a, b in zip(s.elements, t.elements):
                assert (a.text, a.kind) == (b.text, b.kind)
                assert all(abs(u - v) <= px[i % 2] for i, (u, v) in enumerate(zip(a.box, b.box)))
            a, b = s.action, t.action
            assert (a.type, a.direction, a.button, a.text, a.status) == (
                b.type,
                b.direction,
                b.button,
                b.text,
                b.status,
            )
            if a.type == "click":
                assert b.target == a.target
                assert all(abs(u - v) <= 1e-9 for u, v in zip(a.point, b.point))
                assert all(abs(u - v) <= px[i % 2] for i, (u, v) in enumerate(zip(a.box, b.box)))
            assert Path(t.image).is_file()


def test_cli_rejects_bad_config(tmp_path, capsys):
    assert synth_main(["--out", str(tmp_path), "--split", "dev", "--episodes", "1", "--config", "colour=red"]) == 2
    assert "colour" in capsys.readouterr().err


def test_with_meta_adds_only_synth_meta(tmp_path):
    eps = generate_split("dev", 2, seed=1)
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split

    write_aitz_split(eps, tmp_path, "dev", with_meta=True)
    for ep in eps:
        sub = ep.steps[0].meta["subset"]
        name = f"{sub.upper()}-{ep.episode_id}"
        records = json.loads((tmp_path / "dev" / sub / name / f"{name}.json").read_text(encoding="utf-8"))
        for rec, step in zip(records, ep.steps):
            assert set(rec) == set(FIELDS) | {"synth_meta"} and isinstance(rec["synth_meta"], str)
            assert json.loads(rec["synth_meta"]) == step.meta
    aitz = pytest.importorskip("ipl_jax.data.aitz")
    assert len(aitz.load_aitz(tmp_path, "dev")) == 2


def test_render_size_writes_phone_screenshots_with_the_same_fractions(tmp_path):
    """``render_size``: the layout of width x height drawn at a phone's resolution; boxes, points and texts are
    the layout's (fractions of the screen), the PNG is the layout's picture resized."""
    import numpy as np
    from PIL import Image

    from ipl_jax.data.aitz import load_aitz
    from ipl_jax.envs.synthetic import WorldConfig, apply_overrides

    layout = ["width=224", "height=448", "p_start_home=0.3"]
    for name, extra in (("layout", []), ("phone", ["render_size=270,600"])):
        assert (
            synth_main(["--out", str(tmp_path / name), "--split", "dev", "--episodes", "2", "--world", *layout, *extra])
            == 0
        )
    small, phone = load_aitz(tmp_path / "layout", "dev"), load_aitz(tmp_path / "phone", "dev")
    generated = generate_split(
        "dev", 2, seed=0, config=apply_overrides(WorldConfig(), layout + ["render_size=270,600"])
    )
    assert [len(e.steps) for e in small] == [len(e.steps) for e in phone] > [0]
    for e_small, e_phone, e_gen in zip(small, phone, generated):
        for a, b, g in zip(e_small.steps, e_phone.steps, e_gen.steps):
            assert b.screen_size == g.screen_size == (270, 600) and a.screen_size == (224, 448)
            assert a.instruction == b.instruction and a.action.type == b.action.type and a.coat == b.coat
            assert [el.text for el in a.elements] == [el.text for el in b.elements]
            for ea, eb in zip(a.elements, b.elements):  # the same fractions, up to one pixel of each picture
                assert all(abs(u - v) <= 1 / 224 + 1 / 270 for u, v in zip(ea.box, eb.box))
            with Image.open(a.image) as im_a, Image.open(b.image) as im_b:
                assert im_b.size == (270, 600)
                resized = np.asarray(im_a.convert("RGB").resize((270, 600), Image.Resampling.BICUBIC), np.int16)
                assert np.abs(resized - np.asarray(im_b.convert("RGB"), np.int16)).max() == 0
