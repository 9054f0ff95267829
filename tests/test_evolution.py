"""Instruction evolution: Q&A generation checked against the annotations, the filter, JSONL, and the annotator
against a loopback HTTP server."""

import base64
import dataclasses
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from ipl_jax.coat.actions import Action, parse_grounding
from ipl_jax.data import annotator, evolution
from ipl_jax.data.evolution import QA, candidate_qas, evolve_steps, filter_qas
from ipl_jax.data.records import CoaT, DataError, Step, UIElement

# ---------------------------------------------------------------------------------------------- fixtures

# What each icon kind of the fixtures is called in questions (known answers, written out by hand).
ICON_NAMES = {
    "ICON_V_BACKWARD": "back arrow",
    "ICON_SEARCH": "search icon",
    "ICON_HOME": "home icon",
    "ICON_NAV_BAR_CIRCLE": "home button of the navigation bar",
    "ICON_STAR": "star icon",
    "toolbar": "toolbar",
}


def _png(w=40, h=80, color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


def settings_step(transitions=True) -> Step:
    """A settings screen in the synthetic world's style: rows and a button holding text labels."""
    els = (
        UIElement((0.02, 0.005, 0.15, 0.03), "10:15", "TEXT"),  # status bar
        UIElement((0.0, 0.05, 1.0, 0.12), "", "toolbar"),
        UIElement((0.02, 0.06, 0.12, 0.11), "", "ICON_V_BACKWARD"),
        UIElement((0.2, 0.07, 0.6, 0.10), "Settings", "TEXT"),
        UIElement((0.85, 0.06, 0.97, 0.11), "", "ICON_SEARCH"),
        UIElement((0.0, 0.20, 1.0, 0.28), "", "row"),
        UIElement((0.05, 0.22, 0.4, 0.26), "Wi-Fi", "TEXT"),
        UIElement((0.0, 0.30, 1.0, 0.38), "", "row"),
        UIElement((0.05, 0.32, 0.4, 0.36), "Bluetooth", "TEXT"),
        UIElement((0.0, 0.40, 1.0, 0.48), "", "row"),
        UIElement((0.05, 0.42, 0.4, 0.46), "Display", "TEXT"),
        UIElement((0.3, 0.6, 0.7, 0.66), "OK", "button"),
        UIElement((0.45, 0.61, 0.55, 0.65), "OK", "TEXT"),
        UIElement((0.1, 0.93, 0.3, 0.99), "", "ICON_HOME"),
        UIElement((0.6, 0.93, 0.9, 0.99), "Apps", "TEXT"),
    )
    meta = (
        {
            "transitions": {
                "Wi-Fi": "Opens the Wi-Fi page.",
                "Bluetooth": "Opens the Bluetooth page.",
                "Missing": "Not on this screen.",
                "ICON_SEARCH": "Opens the search page.",
            }
        }
        if transitions
        else {}
    )
    return Step(
        "synth-1",
        2,
        "turn on bluetooth",
        _png(),
        (1080, 2400),
        Action("click", point=(0.2, 0.34)),
        elements=els,
        meta=meta,
    )


def shop_step(action=None) -> Step:
    """An AITZ-style screen: OCR texts and ICON_* boxes, no containers, a CoaT, two separate 'Buy' texts."""
    els = (
        UIElement((0.8, 0.0, 0.98, 0.03), "", "ICON_STAR"),  # status bar icon
        UIElement((0.05, 0.06, 0.6, 0.10), "Search for shoes", "TEXT"),
        UIElement((0.1, 0.30, 0.5, 0.34), "Red sneakers", "TEXT"),
        UIElement((0.6, 0.30, 0.8, 0.34), "Buy", "TEXT"),
        UIElement((0.1, 0.50, 0.5, 0.54), "Blue boots", "TEXT"),
        UIElement((0.6, 0.50, 0.8, 0.54), "Buy", "TEXT"),
        UIElement((0.45, 0.94, 0.55, 0.99), "", "ICON_NAV_BAR_CIRCLE"),
    )
    coat = CoaT(
        screen_desc="The screen shows a shoe shop with two products. Each has a buy button.",
        action_result="A product page for the red sneakers opens. It shows sizes and a price.",
    )
    action = action or Action("click", point=(0.3, 0.32))
    return Step("aitz-7", 0, "buy red sneakers", _png(), (270, 600), action, elements=els, coat=coat)


def _target_elements(step, target):
    """The annotated elements a question's target names: by text, or for a textless icon by its kind."""
    by_text = [e for e in step.elements if e.text == target]
    return by_text or [e for e in step.elements if not e.text and ICON_NAMES.get(e.kind) == target]


def _inside(box, point, tol=1e-9):
    return box[0] - tol <= point[0] <= box[2] + tol and box[1] - tol <= point[1] <= box[3] + tol


def _center(box):
    return ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)


# ---------------------------------------------------------------------------------------------- Level I


@pytest.mark.parametrize(
    "step, expected_targets",
    [
        (
            settings_step(),
            {
                "toolbar",
                "back arrow",
                "Settings",
                "search icon",
                "Wi-Fi",
                "Bluetooth",
                "Display",
                "OK",
                "home icon",
                "Apps",
            },
        ),
        # "Buy" names two separate elements (ambiguous) and the star icon is in the status bar: neither is asked.
        (shop_step(), {"Search for shoes", "Red sneakers", "Blue boots", "home button of the navigation bar"}),
    ],
)
def test_grounding_answers_hold_the_named_element(step, expected_targets):
    grounding = candidate_qas(step, seed=0)["grounding"]
    assert {qa.meta["target"] for qa in grounding} == expected_targets
    for qa in grounding:
        assert qa.level == 1
        target = qa.meta["target"]
        assert (f'"{target}"' in qa.question) or (f"the {target}" in qa.question)
        named = _target_elements(step, target)
        assert named, target
        box = parse_grounding(qa.answer)
        assert box is not None and qa.answer.startswith("<|box_start|>") and qa.answer.endswith("<|box_end|>")
        # The box is one named element's box (to the 1/1000 grid) and holds every named element's centre.
        assert any(all(abs(a - b) <= 0.0005 + 1e-9 for a, b in zip(box, e.box)) for e in named)
        for e in named:
            assert _inside(box, _center(e.box), tol=0.0005)


def test_nested_label_grounds_to_its_button():
    (qa,) = [q for q in candidate_qas(settings_step(), 0)["grounding"] if q.meta["target"] == "OK"]
    assert parse_grounding(qa.answer) == pytest.approx((0.3, 0.6, 0.7, 0.66), abs=1e-9)


def test_referring_reads_the_element_in_the_box():
    step = settings_step()
    got = {}
    for qa in candidate_qas(step, 0)["referring"]:
        box = parse_grounding(qa.question)
        (el,) = [
            e
            for e in step.elements
            if e.box == pytest.approx(box, abs=0.0005)
            and (e.text or e.kind)
            and (e.text == qa.answer or qa.answer == f"The {ICON_NAMES.get(e.kind, e.kind)}.")
        ]
        got[qa.answer] = el
    assert set(got) == {
        "The toolbar.",
        "The back arrow.",
        "Settings",
        "The search icon.",
        "Wi-Fi",
        "Bluetooth",
        "Display",
        "OK",
        "The home icon.",
        "Apps",
    }


def test_page_description_sources():
    (from_elements,) = candidate_qas(settings_step(), 0)["page_description"]
    assert from_elements.answer == (
        'The top bar reads "Settings". The page shows the back arrow, the search icon, "Wi-Fi" and "Bluetooth".'
    )
    (from_coat,) = candidate_qas(shop_step(), 0)["page_description"]
    assert from_coat.answer == "The screen shows a shoe shop with two products. Each has a buy button."
    assert from_coat.meta["source"] == "coat"


def test_long_coat_texts_are_cut_at_sentence_ends():
    long_sentence = "The screen shows " + "a very long list of shoes, " * 15 + "and more."
    step = dataclasses.replace(
        shop_step(), coat=CoaT(screen_desc="A shoe shop. " + long_sentence, action_result=long_sentence)
    )
    (qa,) = candidate_qas(step, 0)["page_description"]
    assert qa.answer == "A shoe shop."
    assert candidate_qas(step, 0)["what_happens"] == []  # no sentence fits: nothing rather than a cut sentence
    step = dataclasses.replace(step, coat=CoaT(screen_desc=long_sentence))
    (qa,) = candidate_qas(step, 0)["page_description"]
    assert qa.meta["source"] == "elements" and qa.answer.startswith('The top bar reads "Search for shoes".')


# ---------------------------------------------------------------------------------------------- Level II


def test_nesting_from_box_containment():
    step = settings_step()
    got = {qa.meta["target"]: qa for qa in candidate_qas(step, 0)["nesting"]}
    expected = {
        "Settings": (0.0, 0.05, 1.0, 0.12),
        "Wi-Fi": (0.0, 0.20, 1.0, 0.28),
        "Bluetooth": (0.0, 0.30, 1.0, 0.38),
        "Display": (0.0, 0.40, 1.0, 0.48),
        "OK": (0.3, 0.6, 0.7, 0.66),
    }
    assert set(got) == set(expected)
    for name, container in expected.items():
        qa = got[name]
        assert qa.level == 2 and f'"{name}"' in qa.question
        assert parse_grounding(qa.answer) == pytest.approx(container, abs=0.0005)
        assert tuple(qa.meta["container_box"]) == container
    assert "row" in got["Wi-Fi"].answer and "button" in got["OK"].answer and "toolbar" in got["Settings"].answer
    # OCR-only screens have no containers, so no nesting is claimed.
    assert candidate_qas(shop_step(), 0)["nesting"] == []


def test_widget_function_only_where_known():
    got = {qa.meta["target"]: qa.answer for qa in candidate_qas(settings_step(), 0)["widget_function"]}
    assert got == {
        "back arrow": "It goes back to the previous screen.",
        "search icon": "It opens the search.",
        "Wi-Fi": "Opens the Wi-Fi page.",
        "Bluetooth": "Opens the Bluetooth page.",
        "OK": "It confirms the choice.",
        "home icon": "It returns to the home screen.",
    }
    # A page title that reads "Settings" is a text, not a settings button: no function is claimed for it.
    assert "Settings" not in got


# ---------------------------------------------------------------------------------------------- Level III


def test_page_structure_and_regions():
    (qa,) = candidate_qas(settings_step(), 0)["page_structure"]
    assert qa.level == 3
    assert qa.answer == (
        'Top bar: back arrow, "Settings" and search icon. Main area: 4 rows, starting with '
        '"Wi-Fi", "Bluetooth" and "Display". Bottom bar: home icon and "Apps".'
    )
    regions = {qa.meta["target"]: qa.answer for qa in candidate_qas(settings_step(), 0)["element_region"]}
    expected = {
        "toolbar": "top bar",
        "back arrow": "top bar",
        "Settings": "top bar",
        "search icon": "top bar",
        "Wi-Fi": "main area",
        "Bluetooth": "main area",
        "Display": "main area",
        "OK": "main area",
        "home icon": "bottom bar",
        "Apps": "bottom bar",
    }
    assert set(regions) == set(expected)
    for name, region in expected.items():
        assert region in regions[name].lower()


def test_what_happens_from_transitions_exactly():
    got = {qa.meta["target"]: qa.answer for qa in candidate_qas(settings_step(), 0)["what_happens"]}
    # Exactly the transitions of elements on screen, by text or (textless icons) by kind; "Missing" has no element.
    assert got == {
        "Wi-Fi": "Opens the Wi-Fi page.",
        "Bluetooth": "Opens the Bluetooth page.",
        "search icon": "Opens the search page.",
    }


def test_what_happens_from_coat_for_the_golden_target():
    (qa,) = candidate_qas(shop_step(), 0)["what_happens"]
    assert qa.meta["target"] == "Red sneakers" and qa.meta["source"] == "coat"
    assert qa.answer == "A product page for the red sneakers opens. It shows sizes and a price."
    assert '"Red sneakers"' in qa.question
    # No click (or a click on an ambiguous "Buy"): nothing to say.
    assert candidate_qas(shop_step(Action("scroll", direction="up")), 0)["what_happens"] == []
    assert candidate_qas(shop_step(Action("click", point=(0.7, 0.32))), 0)["what_happens"] == []


# ---------------------------------------------------------------------------------------------- sampling


def test_evolve_is_deterministic_by_seed_and_per_step():
    steps = [settings_step(), shop_step()]
    a = [qa.to_json() for qa in evolve_steps(steps, seed=3, per_step=6)]
    b = [qa.to_json() for qa in evolve_steps(steps, seed=3, per_step=6)]
    c = [qa.to_json() for qa in evolve_steps(steps, seed=4, per_step=6)]
    assert a == b and a != c
    # A step's Q&A do not depend on the other steps evolved with it.
    alone = [qa.to_json() for qa in evolve_steps([shop_step()], seed=3, per_step=6)]
    assert [d for d in a if d["episode_id"] == "aitz-7"] == alone


def test_evolve_spreads_over_kinds_and_levels():
    qas = evolve_steps([settings_step()], seed=0, per_step=8)
    assert len(qas) == 8
    assert len({qa.kind for qa in qas}) == 8  # all eight kinds have candidates here: one of each
    assert {qa.level for qa in qas} == {1, 2, 3}
    level1 = evolve_steps([settings_step()], seed=0, levels=(1,), per_step=50)
    assert {qa.level for qa in level1} == {1} and len(level1) == 10 + 10 + 1
    with pytest.raises(ValueError):
        evolve_steps([settings_step()], seed=0, levels=(4,))


def test_generated_qas_pass_the_filter():
    no_transitions = dataclasses.replace(settings_step(False), episode_id="synth-2")
    qas = evolve_steps([settings_step(), shop_step(), no_transitions], seed=1, per_step=100)
    kept, counts = filter_qas(qas)
    assert len(kept) == len(qas) and counts["kept"] == len(qas)
    assert all(v == 0 for k, v in counts.items() if k != "kept")


# ---------------------------------------------------------------------------------------------- filter


def _qa(answer, kind="widget_function", question="What does the search icon do?", step_id=0):
    return QA("ep", step_id, evolution.LEVEL_OF_KIND.get(kind, 2), kind, question, answer)


BAD = [
    (
        "Since the next action swiping down matches the annotation, the next action is swiping down.",
        "widget_function",
        "justifies_action",
    ),
    ("The annotation says to tap the search icon.", "widget_function", "justifies_action"),
    ("As the next action is click Wi-Fi, this row matters.", "widget_function", "justifies_action"),
    ("It matches the annotated action, so it opens search.", "widget_function", "justifies_action"),
    ("Swiping up or scrolling down is a logical step to explore further.", "widget_function", "multiple_actions"),
    ("You can tap the search icon or scroll down to find it.", "what_happens", "multiple_actions"),
    ("Tap it. Alternatively, press back.", "what_happens", "multiple_actions"),
    ("", "widget_function", "empty"),
    ("   ", "widget_function", "empty"),
    ("?", "widget_function", "too_short"),
    ("x", "widget_function", "too_short"),
    ("It opens the search page. " * 20, "widget_function", "too_long"),
    ("<|box_start|>(100,200),(1200,400)<|box_end|>", "grounding", "bad_box"),
    ("<|box_start|>(-5,200),(300,400)<|box_end|>", "grounding", "bad_box"),
    ("<|box_start|>(100,200)<|box_end|>", "grounding", "bad_box"),
    ("<|box_start|>(300,400),(100,200)<|box_end|>", "grounding", "bad_box"),
    ("near the top of the screen", "grounding", "bad_box"),
    ("<|box_start|>(100,200),(300,400)", "grounding", "bad_box"),
    ("It belongs to the row at <|box_start|>(0,200)(1000<|box_end|>.", "nesting", "bad_box"),
]

GOOD = [
    ("It opens the search.", "widget_function"),
    ("Tapping it opens the Wi-Fi page.", "what_happens"),
    ("Press it to go back.", "widget_function"),
    ("<|box_start|>(100,200),(300,400)<|box_end|>", "grounding"),
    ("(100,200),(300,400)", "grounding"),
    ("It belongs to the row at <|box_start|>(0,200),(1000,280)<|box_end|>.", "nesting"),
    ("OK", "referring"),
]


@pytest.mark.parametrize("answer, kind, reason", BAD)
def test_filter_drops_each_bad_pattern(answer, kind, reason):
    assert evolution.drop_reason(_qa(answer, kind)) == reason
    kept, counts = filter_qas([_qa(answer, kind)])
    assert kept == [] and counts[reason] == 1 and counts["kept"] == 0


@pytest.mark.parametrize("answer, kind", GOOD)
def test_filter_keeps_good_answers(answer, kind):
    kept, counts = filter_qas([_qa(answer, kind)])
    assert len(kept) == 1 and counts["kept"] == 1


def test_filter_duplicates_and_counts():
    q = "Where is the search icon?"
    box = "<|box_start|>(850,60),(970,110)<|box_end|>"
    items = [
        _qa(box, "grounding", q),
        _qa(box + " ", "grounding", q + " "),  # exact duplicate up to whitespace
        _qa("<|box_start|>(1,1),(2,2)<|box_end|>", "grounding", "where is the Search icon"),  # same question again
        _qa(box, "grounding", "Where's the search icon?"),  # same answer, near-identical question
        _qa(box, "grounding", "Locate the search icon."),  # a paraphrase with the same answer is kept
        _qa(box, "grounding", q, step_id=1),  # another screen
        _qa("The annotation says so.", "widget_function"),
        _qa("", "widget_function"),
    ]
    kept, counts = filter_qas(items)
    assert kept == [items[0], items[4], items[5]]
    assert counts == {
        "empty": 1,
        "bad_box": 0,
        "justifies_action": 1,
        "multiple_actions": 0,
        "too_short": 0,
        "too_long": 0,
        "duplicate": 1,
        "near_duplicate": 2,
        "kept": 3,
    }


# ---------------------------------------------------------------------------------------------- JSONL and errors


def test_jsonl_round_trip_and_errors(tmp_path):
    qas = evolve_steps([settings_step(), shop_step()], seed=0, per_step=5)
    path = tmp_path / "qa.jsonl"
    assert evolution.write_qas_jsonl(path, qas) == len(qas)
    back = evolution.read_qas_jsonl(path)
    assert [q.to_json() for q in back] == [q.to_json() for q in qas]
    bad = tmp_path / "bad.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["level"] = "two"
    bad.write_text(lines[0] + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl: record line 2: field 'level'"):
        evolution.read_qas_jsonl(bad)


def test_bad_annotations_raise_clear_errors():
    step = dataclasses.replace(settings_step(), elements=(UIElement((0.1, 0.2, 1.3, 0.3), "Wide", "TEXT"),))
    with pytest.raises(DataError, match=r"synth-1/2: field 'elements\[0\]\.box'"):
        candidate_qas(step, 0)
    step = dataclasses.replace(settings_step(), meta={"transitions": {"Wi-Fi": 3}})
    with pytest.raises(DataError, match=r"meta\.transitions\['Wi-Fi'\]"):
        candidate_qas(step, 0)


# ---------------------------------------------------------------------------------------------- annotator

KEY_ENV = "IPL_TEST_ANNOTATOR_KEY"
KEY = "sk-test-not-a-real-key-4242"


class _Server:
    """A chat completions stand-in on 127.0.0.1: checks the bearer key, records requests, plays canned replies.

    Each canned reply is (status, body text, delay_s). A request with a wrong key gets 401 with the received
    Authorization header echoed in the body (so tests can check it is scrubbed from errors)."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                auth = self.headers.get("Authorization", "")
                server.requests.append({"path": self.path, "auth": auth, "body": json.loads(body)})
                if auth != f"Bearer {KEY}":
                    status, text, delay = 401, json.dumps({"error": f"bad key {auth}"}), 0.0
                else:
                    status, text, delay = server.replies.pop(0) if server.replies else (500, "no reply", 0.0)
                if delay:
                    threading.Event().wait(delay)
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _completion(content: str) -> str:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


VALID_REPLY = _completion(
    "Here you go:\n```json\n"
    + json.dumps(
        [
            {
                "type": "grounding",
                "question": "Where is the Wi-Fi row?",
                "answer": "<|box_start|>(0,200),(1000,280)<|box_end|>",
            },
            {"type": "function", "question": "What does the back arrow do?", "answer": "It returns to the last page."},
            {"type": "structure", "question": "What is in the top bar?", "answer": "A back arrow, a title and search."},
            {"question": "No answer here"},
        ]
    )
    + "\n```"
)
MALFORMED_REPLY = _completion("Sure! Question: where is Wi-Fi? Answer: at the top [of the list")


def _config(base_url, **kw):
    return annotator.AnnotatorConfig(
        base_url=base_url,
        model="test-vlm",
        api_key_env=KEY_ENV,
        temperature=0.3,
        timeout_s=2.0,
        max_retries=2,
        backoff_s=0.0,
        **kw,
    )


def test_annotator_loopback(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with _Server([(200, VALID_REPLY, 0.0), (200, MALFORMED_REPLY, 0.0)]) as srv:
        qas, stats = annotator.annotate_steps([settings_step(), shop_step()], _config(srv.base_url))
    assert stats == annotator.AnnotatorStats(screens=2, requests=2, failed=0, malformed=1, items=3, items_skipped=1)
    assert [(q.episode_id, q.level, q.kind) for q in qas] == [
        ("synth-1", 1, "grounding"),
        ("synth-1", 2, "widget_function"),
        ("synth-1", 3, "page_structure"),
    ]
    assert qas[1].answer == "It returns to the last page." and qas[1].meta["source"] == "annotator"
    assert parse_grounding(qas[0].answer) == pytest.approx((0.0, 0.2, 1.0, 0.28))
    req = srv.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == f"Bearer {KEY}"
    body = req["body"]
    assert body["model"] == "test-vlm" and body["temperature"] == 0.3
    (msg,) = body["messages"]
    text_part, image_part = msg["content"]
    assert '"Wi-Fi"' in text_part["text"] and "<|box_start|>(50,220),(400,260)<|box_end|>" in text_part["text"]
    assert "10:15" not in text_part["text"]  # status bar left out
    url = image_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert img.size == (40, 80) and img.getpixel((5, 5)) == (200, 30, 30)
    # The second screen's prompt carries its CoaT screen description.
    assert "shoe shop" in srv.requests[1]["body"]["messages"][0]["content"][0]["text"]
    # Annotator output goes through the same filter.
    kept, counts = filter_qas(qas)
    assert counts["kept"] == 3


def test_annotator_retries_are_bounded(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with _Server([(503, "busy", 0.0), (200, VALID_REPLY, 0.0)]) as srv:
        qas, stats = annotator.annotate_steps([settings_step()], _config(srv.base_url))
    assert stats.requests == 2 and stats.failed == 0 and len(qas) == 3
    with _Server([(503, "busy", 0.0)] * 5) as srv:
        qas, stats = annotator.annotate_steps([settings_step()], _config(srv.base_url))
    assert qas == [] and stats.requests == 3 and stats.failed == 1 and len(srv.requests) == 3
    # A reply slower than the timeout counts as a failed attempt.
    with _Server([(200, VALID_REPLY, 0.8)] * 2) as srv:
        config = dataclasses.replace(_config(srv.base_url), timeout_s=0.2, max_retries=1)
        qas, stats = annotator.annotate_steps([settings_step()], config)
    assert qas == [] and stats.requests == 2 and stats.failed == 1


def test_annotator_key_never_leaks(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY + "-wrong")
    with _Server([]) as srv:
        with pytest.raises(annotator.AnnotatorError) as err:
            annotator.annotate_steps([settings_step()], _config(srv.base_url))
    assert "401" in str(err.value) and (KEY + "-wrong") not in str(err.value) and "***" in str(err.value)
    assert len(srv.requests) == 1  # a rejected key is not retried
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(annotator.AnnotatorError, match=KEY_ENV):
        annotator.annotate_steps([settings_step()], _config("http://127.0.0.1:9/v1"))


@pytest.mark.parametrize(
    "reply, n",
    [
        ('[{"question": "q", "answer": "a"}]', 1),
        ('```json\n[{"question": "q", "answer": "a"}, {"question": "r", "answer": "b"}]\n```', 2),
        ('{"qa": [{"question": "q", "answer": "a"}]}', 1),
        ('{"questions": ["q1", "q2"], "answers": ["a1", "a2"]}', 2),
        ("Here are pairs: [{\"question\": \"q\", \"answer\": \"a\"}] Enjoy.", 1),
        ("no json at all", None),
        ('```json\n[{"question": "q", "answer": \n```', None),
        ('["just", "strings"]', None),
        ("", None),
    ],
)
def test_parse_qa_reply(reply, n):
    items = annotator.parse_qa_reply(reply)
    assert (items is None) if n is None else (len(items) == n)
