"""`ipl-jax score`: predictions file parsing and the CLI on a tiny AITZ-format dataset built here."""

import json

import pytest
from PIL import Image

from ipl_jax.cli.score import main as score_main
from ipl_jax.coat.actions import Action
from ipl_jax.data.records import DataError
from ipl_jax.eval.predictions import load_predictions, prediction_to_action, split_prediction_text

W, H = 270, 600


# ------------------------------------------------------------------------------------------ predictions


def test_split_prediction_text():
    assert split_prediction_text("click Wi-Fi\n<|box_start|>(1,2),(3,4)<|box_end|>") == (
        "click Wi-Fi\n",
        "<|box_start|>(1,2),(3,4)<|box_end|>",
    )
    assert split_prediction_text("click Wi-Fi <|box_start|>(1,2),(3,4)<|box_end|>")[0] == "click Wi-Fi "
    assert split_prediction_text("click OK\n(500,500)") == ("click OK", "(500,500)")
    assert split_prediction_text('type "hi"') == ('type "hi"', None)


def test_prediction_forms():
    a = prediction_to_action("click Wi-Fi\n<|box_start|>(100,200),(300,400)<|box_end|>")
    assert (a.type, a.target) == ("click", "Wi-Fi") and a.point == pytest.approx((0.2, 0.3))
    a = prediction_to_action("click Wi-Fi <|box_start|>(100,200),(300,400)<|box_end|>")
    assert a.target == "Wi-Fi" and a.point == pytest.approx((0.2, 0.3))
    a = prediction_to_action({"action": "click OK", "grounding": "<|box_start|>(0,0),(10,20)<|box_end|>"})
    assert a.point == pytest.approx((0.005, 0.01))
    assert prediction_to_action('type "Hello"') == Action(type="type", text="Hello")
    assert prediction_to_action({"type": "click", "x": 0.25, "y": 0.75}) == Action(type="click", point=(0.25, 0.75))
    assert prediction_to_action({"type": "click", "box": [0.1, 0.2, 0.3, 0.4]}).point == pytest.approx((0.2, 0.3))
    assert prediction_to_action({"type": "TYPE", "text": "x"}) == Action(type="type", text="x")
    assert prediction_to_action({"type": "scroll", "direction": "Up"}) == Action(type="scroll", direction="up")
    assert prediction_to_action({"type": "press", "button": "back"}) == Action(type="press", button="back")
    assert prediction_to_action({"type": "stop"}) == Action(type="stop")
    assert prediction_to_action(Action(type="click", point=(0.1, 0.2)).to_json()).point == (0.1, 0.2)
    # unusable structured / text forms are misses, not errors
    for bad in (
        {"type": "click", "x": 540, "y": 1200},
        {"type": "click"},
        {"type": "scroll", "direction": "in"},
        {"type": "press", "button": "power"},
        {"type": "type", "text": 3},
        {"type": "fly"},
        {"action": None},
        {"foo": 1},
        None,
        17,
        ["click"],
        "",
        "lorem ipsum",
        {"type": "stop", "parsed": False},
    ):
        a = prediction_to_action(bad)
        assert not a.parsed and a.type == "invalid", bad


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_predictions_errors_name_the_line(tmp_path):
    good = json.dumps({"episode_id": "1", "step_id": 0, "prediction": "stop"})
    with pytest.raises(DataError, match=r"line 3.*not valid JSON"):
        load_predictions(_write(tmp_path / "p.jsonl", [good, "", "{oops"]))
    with pytest.raises(DataError, match=r"line 2.*'step_id'.*missing"):
        load_predictions(_write(tmp_path / "p.jsonl", [good, json.dumps({"episode_id": "1", "prediction": "stop"})]))
    with pytest.raises(DataError, match=r"line 2.*already given on line 1"):
        load_predictions(_write(tmp_path / "p.jsonl", [good, good]))
    with pytest.raises(DataError, match=r"line 1.*step_id.*expected an int"):
        load_predictions(
            _write(tmp_path / "p.jsonl", [json.dumps({"episode_id": "1", "step_id": "0", "prediction": ""})])
        )
    preds = load_predictions(
        _write(tmp_path / "p.jsonl", [good, json.dumps({"episode_id": 2, "step_id": 1, "prediction": "zzz"})])
    )
    assert preds[("1", 0)] == Action(type="stop") and not preds[("2", 1)].parsed


# ------------------------------------------------------------------------------------- tiny AITZ dataset


def _record(subset, ep, step, n, code, touch=(-1.0, -1.0), lift=(-1.0, -1.0), text="", positions=()):
    return {
        "episode_id": ep,
        "episode_length": n,
        "step_id": step,
        "instruction": f"task {ep}",
        "image_path": f"{subset.lower()}/{subset}-{ep}/{subset}-{ep}_{step}.png",
        "ui_positions": json.dumps([list(p) for p in positions]),
        "ui_text": json.dumps(["el"] * len(positions)),
        "ui_types": json.dumps(["TEXT"] * len(positions)),
        "result_action_type": code,
        "result_touch_yx": json.dumps(list(touch)),
        "result_lift_yx": json.dumps(list(lift)),
        "result_action_text": text,
        "coat_screen_desc": "",
        "coat_action_think": "",
        "coat_action_desc": "",
        "coat_action_result": "",
    }


def make_aitz(root):
    """Two test episodes: '100' click / type / stop, '200' scroll up / press back / stop."""
    episodes = {
        ("GENERAL", "100"): [
            # a tap at (x 0.5, y 0.3) on an element spanning the full width, pixel rows 160..200
            _record("GENERAL", "100", 0, 3, 4, (0.3, 0.5), (0.3, 0.5), positions=[(160, 0, 40, 270)]),
            _record("GENERAL", "100", 1, 3, 3, text="Hello World"),
            _record("GENERAL", "100", 2, 3, 10),
        ],
        ("GOOGLE_APPS", "200"): [
            _record("GOOGLE_APPS", "200", 0, 3, 4, (0.8, 0.5), (0.3, 0.5)),
            _record("GOOGLE_APPS", "200", 1, 3, 5),
            _record("GOOGLE_APPS", "200", 2, 3, 10),
        ],
    }
    for (subset, ep), recs in episodes.items():
        d = root / "test" / subset.lower() / f"{subset}-{ep}"
        d.mkdir(parents=True)
        (d / f"{subset}-{ep}.json").write_text(json.dumps(recs), encoding="utf-8")
        for r in recs:
            Image.new("RGB", (W, H), (200, 200, 200)).save(d / f"{subset}-{ep}_{r['step_id']}.png")
    return root


def _pred(ep, step, p):
    return json.dumps({"episode_id": ep, "step_id": step, "prediction": p})


GOLDEN_STRUCTURED = [
    _pred("100", 0, {"type": "click", "x": 0.5, "y": 0.3}),
    _pred("100", 1, {"type": "type", "text": "Hello World"}),
    _pred("100", 2, {"type": "stop"}),
    _pred("200", 0, {"type": "scroll", "direction": "up"}),
    _pred("200", 1, {"type": "press", "button": "back"}),
    _pred("200", 2, {"type": "stop"}),
]


@pytest.fixture
def aitz_root(tmp_path):
    pytest.importorskip("ipl_jax.data.aitz")
    return make_aitz(tmp_path / "aitz")


def _score(tmp_path, root, lines, *extra):
    preds = _write(tmp_path / "preds.jsonl", lines)
    out = tmp_path / "out" / "table.json"
    rc = score_main(["--data", str(root), "--format", "aitz", "--predictions", str(preds), "--json", str(out), *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_score_golden_predictions_is_full(tmp_path, aitz_root, capsys):
    rc, table = _score(tmp_path, aitz_root, GOLDEN_STRUCTURED)
    assert rc == 0
    for key in ("total", "CLICK", "TYPE", "SCROLL", "PRESS", "STOP"):
        assert table[key]["type_acc"] == 1.0 and table[key]["exact_acc"] == 1.0, key
    assert table["total"]["count"] == 6 and table["CLICK"]["count"] == 1
    assert table["parse_rate"] == table["episode_success"] == table["goal_progress"] == 1.0
    assert "total" in capsys.readouterr().out


def test_score_text_predictions_known_answers(tmp_path, aitz_root):
    lines = [
        # click in the golden row's box, far from the golden point: exact by the box rule
        _pred("100", 0, "click the row\n<|box_start|>(900,290),(1000,310)<|box_end|>"),
        _pred("100", 1, 'type "hello"'),  # contained in "hello world": exact
        _pred("100", 2, "press back"),  # wrong type: the episode fails at step 2
        _pred("200", 0, "scroll down"),  # type match, wrong direction
        _pred("200", 1, "press back"),
        # ("200", 2) is missing: a miss
    ]
    rc, t = _score(tmp_path, aitz_root, lines)
    assert rc == 0
    assert t["total"] == {"count": 6, "type_acc": pytest.approx(4 / 6), "exact_acc": pytest.approx(3 / 6)}
    assert t["CLICK"]["exact_acc"] == 1.0 and t["SCROLL"] == {"count": 1, "type_acc": 1.0, "exact_acc": 0.0}
    assert t["STOP"] == {"count": 2, "type_acc": 0.0, "exact_acc": 0.0}
    assert t["parse_rate"] == pytest.approx(5 / 6)
    assert t["episode_success"] == 0.0
    assert t["goal_progress"] == pytest.approx((2 / 3 + 0) / 2)
    assert t["steps_without_prediction"] == 1 and t["predictions_unmatched"] == 0
    # the older AITW matcher ignores the scroll's sign: one more exact step
    rc, t = _score(tmp_path, aitz_root, lines, "--rules", "aitw")
    assert t["rules"] == "aitw" and t["total"]["exact_acc"] == pytest.approx(4 / 6)


def test_score_garbage_is_zero(tmp_path, aitz_root):
    lines = [_pred(ep, s, "I am not sure what to do here.") for ep in ("100", "200") for s in range(3)]
    lines.append(_pred("999", 0, "stop"))  # matches no step: ignored
    rc, t = _score(tmp_path, aitz_root, lines)
    assert rc == 0
    assert t["total"] == {"count": 6, "type_acc": 0.0, "exact_acc": 0.0}
    assert t["parse_rate"] == t["episode_success"] == t["goal_progress"] == 0.0
    assert t["predictions_unmatched"] == 1


def test_score_bad_line_is_a_clear_error(tmp_path, aitz_root, capsys):
    rc, table = _score(tmp_path, aitz_root, GOLDEN_STRUCTURED[:2] + ["not json"])
    assert rc == 1 and table is None
    assert "line 3" in capsys.readouterr().err


def test_score_through_the_cli_dispatcher(tmp_path, aitz_root):
    from ipl_jax import cli

    preds = _write(tmp_path / "preds.jsonl", GOLDEN_STRUCTURED)
    out = tmp_path / "t.json"
    assert (
        cli.main(
            [
                "score",
                "--data",
                str(aitz_root),
                "--format",
                "aitz",
                "--predictions",
                str(preds),
                "--split",
                "test",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["total"]["exact_acc"] == 1.0


def test_score_missing_split_is_a_clear_error(tmp_path, aitz_root, capsys):
    preds = _write(tmp_path / "preds.jsonl", GOLDEN_STRUCTURED)
    rc = score_main(["--data", str(aitz_root), "--format", "aitz", "--predictions", str(preds), "--split", "train"])
    assert rc == 2 and "train" in capsys.readouterr().err  # a usage error: the split does not exist
