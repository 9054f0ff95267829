"""Reading scores (``eval.reading``): page named, element texts reproduced, grounding -- hand-computed vectors, the
golden CoaT of the synthetic world scoring what it should, and the page phrase surviving the job's data stage
(AITZ files, ArrayRecord shards)."""

from __future__ import annotations

import pytest

from ipl_jax.coat.actions import Action, invalid_action
from ipl_jax.data.records import Step, UIElement
from ipl_jax.eval.reading import grounded, page_named, reading_scores, screen_texts, step_reading, texts_read

GOLD_CLICK = Action(type="click", point=(0.5, 0.5), box=(0.4, 0.4, 0.6, 0.6), target="Wi-Fi")


@pytest.mark.parametrize(
    "description, page, want",
    [
        ("This is the Settings list. Top: Wi-Fi.", "the Settings list", True),
        ("settings   LIST, top: wi-fi", "the Settings list", True),  # case, spaces; the article is optional
        ("The screen shows the chat with Annabel.", "the chat with Anna", False),  # word boundary
        ("Shop results for lamp; top: Lamp A.", "Shop results for lamp", True),
        ("Shop results for lamps.", "Shop results for lamp", False),
        ("This is the Settings list.", "the Wi-Fi settings", False),
        ("This is the home screen, page 2.", "the home screen, page 1", False),
        ("", "the Settings list", False),
        ("This is the Settings list.", None, None),  # a dataset without page phrases
        ("This is the Settings list.", "", None),
    ],
)
def test_page_named(description, page, want):
    assert page_named(description, page) is want


def test_texts_read_is_the_share_of_distinct_texts_found():
    # distinct texts {"wi-fi", "bluetooth", "display", "on"}: all but "display" found ("on" in "bluetooth on")
    assert texts_read("Top: WI-FI; bottom: bluetooth  ON", ["Wi-Fi", "Bluetooth", "wi-fi", "Display", " ", "On"]) == (
        3 / 4
    )
    assert texts_read("nothing here", ["Wi-Fi", "Display"]) == 0.0
    assert texts_read("Sun   22 June", ["sun 22 june"]) == 1.0  # whitespace runs collapse on both sides
    assert texts_read("anything", []) is None and texts_read("anything", ["", "  "]) is None
    assert texts_read(None, ["Wi-Fi"]) == 0.0


@pytest.mark.parametrize(
    "pred, want",
    [
        (Action(type="click", point=(0.45, 0.55)), True),
        (Action(type="click", point=(0.6, 0.4)), True),  # on the box's corner: edges count
        (Action(type="click", point=(0.61, 0.5)), False),  # Step.Acc's enlarged box would take it; grounding not
        (Action(type="long_press", point=(0.5, 0.5)), False),  # another type
        (Action(type="click", point=(float("nan"), 0.5)), False),
        (Action(type="click"), False),  # no point
        (invalid_action(), False),
        (None, False),
    ],
)
def test_grounded_click(pred, want):
    assert grounded(pred, GOLD_CLICK) is want


def test_grounded_applies_to_clicks_on_elements_only():
    assert grounded(Action(type="click", point=(0.5, 0.5)), Action(type="click", point=(0.5, 0.5))) is None
    assert grounded(Action(type="scroll", direction="up"), Action(type="scroll", direction="up")) is None
    lp = Action(type="long_press", point=(0.2, 0.2), box=(0.1, 0.1, 0.3, 0.3))
    assert grounded(Action(type="long_press", point=(0.15, 0.29)), lp) is True


def _step(step_id: int, action: Action, page: str | None) -> Step:
    elements = (
        UIElement(box=(0.0, 0.0, 0.2, 0.03), text="20:34"),  # the status bar: not a screen text
        UIElement(box=(0.4, 0.4, 0.6, 0.6), text="Wi-Fi"),
        UIElement(box=(0.1, 0.7, 0.5, 0.8), text="Bluetooth"),
        UIElement(box=(0.5, 0.7, 0.9, 0.8), text=""),  # an icon without text
    )
    meta = {} if page is None else {"page_name": page}
    return Step("e1", step_id, "turn on wi-fi", b"", (100, 200), action, elements=elements, meta=meta)


def test_reading_scores_of_a_split():
    steps = [
        _step(0, GOLD_CLICK, "the Settings list"),
        _step(1, Action(type="scroll", direction="down"), "the Settings list"),
        _step(2, GOLD_CLICK, "the Wi-Fi settings"),
    ]
    assert screen_texts(steps[0]) == ["Wi-Fi", "Bluetooth"]
    records = [  # out of order: matched by (episode, step)
        {"episode_id": "e1", "step_id": 2, "turns": ["The Settings list.", "", "", ""], "action": None},
        {
            "episode_id": "e1",
            "step_id": 0,
            "turns": ["This is the Settings list. Top: Wi-Fi, Bluetooth."],
            "action": {"type": "click", "point": [0.5, 0.45]},
        },
        {
            "episode_id": "e1",
            "step_id": 1,
            "turns": ["Settings list: wi-fi"],
            "action": {"type": "scroll", "direction": "down"},
        },
    ]
    assert step_reading(steps[2], records[0]) == {"page": False, "texts": 0.0, "grounding": False}
    got = reading_scores(steps, records)
    # page: steps 0, 1 yes, step 2 no; texts: 2/2, 1/2, 0/2; grounding: step 0 inside, step 2 no action
    assert got == {
        "page": pytest.approx(2 / 3),
        "texts": pytest.approx(0.5),
        "grounding": 0.5,
        "steps": 3,
        "page_steps": 3,
        "texts_steps": 3,
        "grounding_steps": 2,
    }
    plain = reading_scores([_step(0, GOLD_CLICK, None)], records[1:2])  # no page phrases (AITZ, AMEX)
    assert plain["page"] is None and plain["page_steps"] == 0 and plain["texts"] == 1.0
    with pytest.raises(ValueError, match="no evaluation record for episode 'e1' step 0"):
        reading_scores(steps, records[:1])


def test_golden_descriptions_of_the_world_name_their_page():
    """The world's own CoaT reads its screens: every golden description names its page and every golden click is
    grounded; it lists most, not all, element texts (titles and long lists are left out)."""
    from ipl_jax.envs.synthetic import generate_split

    steps = [s for e in generate_split("test", 6, seed=0) for s in e.steps]
    records = [
        {"episode_id": s.episode_id, "step_id": s.step_id, "turns": [s.coat.screen_desc], "action": s.action.to_json()}
        for s in steps
    ]
    got = reading_scores(steps, records)
    assert got["page"] == 1.0 and got["grounding"] == 1.0 and got["page_steps"] == len(steps)
    assert 0.5 < got["texts"] < 1.0
    # another step's description names the wrong page for at least some steps
    shifted = [{**r, "turns": [steps[(i + 1) % len(steps)].coat.screen_desc]} for i, r in enumerate(records)]
    assert reading_scores(steps, shifted)["page"] < 1.0


def test_the_page_phrase_survives_the_jobs_data_files(tmp_path):
    """The data stage writes ``page_name`` alone as synth_meta: read back from AITZ and from ArrayRecord shards,
    each step holds its phrase and none of the world's other meta (which instruction evolution would read)."""
    from ipl_jax.data.datasets import load_dataset
    from ipl_jax.data.packed.writer import pack_dataset
    from ipl_jax.envs.synthetic import generate_split
    from ipl_jax.envs.synthetic.aitz_writer import write_aitz_split

    episodes = generate_split("dev", 2, seed=5)
    write_aitz_split(episodes, tmp_path / "aitz", "dev", with_meta=("page_name",))
    pack_dataset("synthetic", tmp_path / "aitz", tmp_path / "packed", shards=1)
    want = {(s.episode_id, s.step_id): s.meta["page_name"] for e in episodes for s in e.steps}
    assert all(want.values())
    for root in (tmp_path / "aitz", tmp_path / "packed"):
        back = {(s.episode_id, s.step_id): s.meta for e in load_dataset(root, "aitz", "dev") for s in e.steps}
        assert {k: m["page_name"] for k, m in back.items()} == want
        assert not {"app", "page", "transitions", "intent"} & {k for m in back.values() for k in m}
