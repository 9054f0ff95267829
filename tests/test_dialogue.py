"""CoaT dialogues: loss masks, sampler segments, history in the thought prompt, bucket padding, collation."""

import dataclasses

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("transformers")

from ipl_jax.coat.actions import Action
from ipl_jax.data.batching import collate, pad_to_bucket, smallest_bucket
from ipl_jax.data.dialogue import (
    DEFAULT_PROMPTS,
    CoaTPrompts,
    MissingCoaTError,
    annotated_steps,
    coat_example,
    coat_segments,
    coat_turn_texts,
    golden_action_texts,
    has_coat,
    qa_example,
)
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import CoaT, DataError, Step, UIElement
from ipl_jax.data.tiny_tokenizer import default_corpus, train_tokenizer, write_tokenizer
from ipl_jax.data.tokenizer import load_tokenizer

IMAGE_CFG = ImageProcessorConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(train_tokenizer(default_corpus(n_lines=400), vocab_size=700), d)
    return load_tokenizer(d)


def _image(w=90, h=160, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _step(action, history=(), coat=True, **kw):
    img = _image()
    c = (
        CoaT(
            screen_desc='Settings page: "Wi-Fi" toggle, 3 list items, a search icon.',
            action_think="I opened Settings. The screen shows Wi-Fi. I need to turn it on.",
        )
        if coat
        else None
    )
    return Step(
        episode_id="ep1",
        step_id=2,
        instruction="Turn on Wi-Fi",
        image=lambda: img,
        screen_size=(90, 160),
        action=action,
        history=tuple(history),
        coat=c,
        **kw,
    )


CLICK = Action("click", point=(0.5, 0.25), box=(0.4, 0.2, 0.6, 0.3), target="Wi-Fi toggle")
SCROLL = Action("scroll", direction="down")


def _turn_text(tok, ex, t):
    return tok.decode(ex.input_ids[ex.turn_index == t])


def test_loss_mask_covers_exactly_the_assistant_texts(tok):
    step = _step(CLICK, history=["open_app \"Settings\""])
    ex = coat_example(step, tok, IMAGE_CFG)
    golden = coat_turn_texts(step)
    assert golden[3] == "click Wi-Fi toggle" and golden[4] == "<|box_start|>(400,200),(600,300)<|box_end|>"
    assert ex.input_ids.dtype == np.int32 and ex.input_ids.shape == ex.loss_mask.shape == ex.turn_index.shape
    for t in (1, 2, 3, 4):
        sel = ex.turn_index == t
        assert np.all(ex.loss_mask[sel] == 1)
        assert _turn_text(tok, ex, t) == golden[t] + "<|im_end|>"
        # each turn is one contiguous run ending with <|im_end|>
        idx = np.flatnonzero(sel)
        assert np.all(np.diff(idx) == 1) and ex.input_ids[idx[-1]] == tok.ids.im_end
    assert np.array_equal(ex.loss_mask == 1, ex.turn_index > 0)
    # the rest is the chat around the replies: 4 user turns, the image expanded to its merged patch count
    n_img = int(np.prod(ex.image_grid_thw[0])) // 4
    assert int((ex.input_ids == tok.ids.image_pad).sum()) == n_img
    assert np.all(ex.loss_mask[ex.input_ids == tok.ids.image_pad] == 0)
    context = tok.decode(ex.input_ids[ex.loss_mask == 0])
    assert context.count("<|im_start|>user\n") == 4 and context.count("<|im_start|>assistant\n") == 4
    assert context.startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|>"
    )
    assert DEFAULT_PROMPTS.describe in context and DEFAULT_PROMPTS.act in context
    assert DEFAULT_PROMPTS.ground in context
    assert ex.input_ids[-1] == tok.ids.im_end  # ends with the last reply's <|im_end|>
    assert ex.pixel_values.shape == (int(np.prod(ex.image_grid_thw[0])), 1176)


@pytest.mark.parametrize("action", [CLICK, SCROLL, Action("type", text="hello world"), Action("stop")])
def test_segments_concatenate_to_the_training_example(tok, action):
    step = _step(action, history=["click Settings", "scroll down"])
    ex = coat_example(step, tok, IMAGE_CFG)
    seg = coat_segments(step, tok, IMAGE_CFG)
    assert seg.turns == (1, 2, 3, 4) and set(seg.turn_prompt_ids) == {2, 3, 4}
    pieces = [seg.prefix_ids, seg.target_ids[1]]
    for t in (2, 3, 4):
        if t in seg.target_ids:
            pieces += [seg.turn_prompt_ids[t], seg.target_ids[t]]
    np.testing.assert_array_equal(np.concatenate(pieces), ex.input_ids)
    # the prefix ends with the assistant header; each prompt runs from after <|im_end|> to the next header
    assert tok.decode(seg.prefix_ids[-3:]).endswith("<|im_start|>assistant\n")
    assert tok.decode(seg.turn_prompt_ids[3]) == (
        f"\n<|im_start|>user\n{DEFAULT_PROMPTS.act}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert np.all(seg.target_ids[1][-1:] == tok.ids.im_end)
    np.testing.assert_array_equal(seg.pixel_values, ex.pixel_values)


def test_history_appears_in_the_thought_prompt(tok):
    step = _step(SCROLL, history=["click Settings", 'type "wifi"'])
    seg = coat_segments(step, tok, IMAGE_CFG)
    prompt = tok.decode(seg.turn_prompt_ids[2])
    assert "Task: Turn on Wi-Fi\nDone: click Settings; type \"wifi\"\n" in prompt
    first = coat_segments(_step(SCROLL, history=()), tok, IMAGE_CFG)
    assert "Done: nothing yet\n" in tok.decode(first.turn_prompt_ids[2])
    short = CoaTPrompts(max_history=1)
    ex = coat_example(step, tok, IMAGE_CFG, prompts=short)
    text = tok.decode(ex.input_ids)
    assert "Done: type \"wifi\"\n" in text and "click Settings" not in text


def test_non_click_steps_have_three_turns(tok):
    for action in (SCROLL, Action("press", button="back"), Action("stop"), Action("type", text="abc")):
        ex = coat_example(_step(action), tok, IMAGE_CFG)
        assert set(np.unique(ex.turn_index)) == {0, 1, 2, 3}
        assert tok.decode(ex.input_ids).count("<|im_start|>user\n") == 3
        seg = coat_segments(_step(action), tok, IMAGE_CFG)
        assert set(seg.target_ids) == {1, 2, 3} and 4 in seg.turn_prompt_ids  # the sampler may still ground
    lp = coat_example(_step(Action("long_press", box=(0.1, 0.1, 0.2, 0.2), target="photo")), tok, IMAGE_CFG)
    assert lp.turn_index.max() == 4


def test_dropped_turns_and_loss_turns(tok):
    step = _step(CLICK)
    ex = coat_example(step, tok, IMAGE_CFG, turns=(3, 4))
    assert set(np.unique(ex.turn_index)) == {0, 3, 4}
    text = tok.decode(ex.input_ids)
    assert DEFAULT_PROMPTS.describe not in text and "Task:" not in text
    assert "<|im_start|>user\n<|vision_start|><|image_pad|>" in text and text.count("<|im_start|>user") == 2
    seg = coat_segments(step, tok, IMAGE_CFG, turns=(3, 4))
    np.testing.assert_array_equal(
        np.concatenate([seg.prefix_ids, seg.target_ids[3], seg.turn_prompt_ids[4], seg.target_ids[4]]), ex.input_ids
    )
    masked = coat_example(step, tok, IMAGE_CFG, loss_turns=(3,))
    full = coat_example(step, tok, IMAGE_CFG)
    np.testing.assert_array_equal(masked.input_ids, full.input_ids)
    np.testing.assert_array_equal(masked.loss_mask, (full.turn_index == 3).astype(np.int32))
    with pytest.raises(ValueError, match="increasing subset"):
        coat_example(step, tok, IMAGE_CFG, turns=(2, 1))


def test_qa_example(tok):
    ex = qa_example(tok, IMAGE_CFG, _image(), "What does the gear icon do?", "It opens the settings.")
    assert tok.decode(ex.input_ids[ex.loss_mask == 1]) == "It opens the settings.<|im_end|>"
    assert set(np.unique(ex.turn_index)) == {0, 1}
    assert tok.decode(ex.input_ids[ex.loss_mask == 0]).endswith(
        "What does the gear icon do?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_fallback_texts_and_bad_steps():
    step = _step(
        SCROLL,
        coat=False,
        elements=(UIElement((0, 0, 1, 0.1), "Wi-Fi"), UIElement((0, 0, 1, 1), "")),
        step_instruction="Scroll down to find Wi-Fi",
    )
    texts = coat_turn_texts(step, fallback=True)
    assert texts == {1: "Screen with: Wi-Fi.", 2: "Scroll down to find Wi-Fi", 3: "scroll down"}
    point_only = coat_turn_texts(_step(Action("click", point=(0.25, 0.5), target="OK")))
    assert point_only[4] == "<|box_start|>(250,500),(250,500)<|box_end|>"
    with pytest.raises(DataError, match="ep1/2.*action.box"):
        coat_turn_texts(_step(Action("click", target="OK")))


def test_a_step_without_coat_is_refused_by_supervised_paths_unless_fallback_is_asked_for(tok):
    """A record that carries only its action (no screen description or thought) never trains on made-up texts:
    the example builders refuse it, ``annotated_steps`` leaves it out and counts it, and the sampler's segments
    hold only its golden action and grounding."""
    bare = _step(CLICK, coat=False)
    half = _step(SCROLL, coat=False, step_instruction="Scroll down")
    half = dataclasses.replace(half, coat=CoaT(screen_desc="A list.", action_think="  "))
    full = _step(SCROLL)
    assert [has_coat(s) for s in (bare, half, full)] == [False, False, True]
    for step in (bare, half):
        with pytest.raises(MissingCoaTError, match="ep1/2: no CoaT annotation"):
            coat_turn_texts(step)
        with pytest.raises(MissingCoaTError, match="data.coat_fallback"):
            coat_example(step, tok, IMAGE_CFG)
    assert annotated_steps([bare, full, half]) == ([full], 2)
    assert annotated_steps([bare, full], fallback=True) == ([bare, full], 0)
    seg = coat_segments(bare, tok, IMAGE_CFG)
    assert set(seg.target_ids) == {3, 4} and set(seg.turn_prompt_ids) == {2, 3, 4}
    assert tok.decode(seg.target_ids[3]) == "click Wi-Fi toggle<|im_end|>"
    assert golden_action_texts(bare) == {3: "click Wi-Fi toggle", 4: "<|box_start|>(400,200),(600,300)<|box_end|>"}
    ex = coat_example(bare, tok, IMAGE_CFG, fallback=True)  # opted in: the fallback texts of turns 1 and 2
    assert _turn_text(tok, ex, 2) == "The next action is click Wi-Fi toggle.<|im_end|>"


def test_pad_to_bucket():
    assert smallest_bucket(5, (8, 4, 16)) == 8 and smallest_bucket(8, (4, 8)) == 8
    out, b = pad_to_bucket(
        {"ids": np.arange(1, 6, dtype=np.int32), "mask": np.ones(5, bool)}, (4, 8, 16), pad_values={"ids": -1}
    )
    assert b == 8
    np.testing.assert_array_equal(out["ids"], [1, 2, 3, 4, 5, -1, -1, -1])
    np.testing.assert_array_equal(out["mask"], [1, 1, 1, 1, 1, 0, 0, 0])
    out2, b2 = pad_to_bucket({"pv": np.ones((4, 3), np.float32)}, (4, 8))
    assert b2 == 4 and out2["pv"].shape == (4, 3)
    with pytest.raises(ValueError, match="length 17 exceeds the largest bucket 16"):
        pad_to_bucket({"ids": np.zeros(17)}, (4, 8, 16))
    with pytest.raises(ValueError, match="differ in length"):
        pad_to_bucket({"a": np.zeros(3), "b": np.zeros(4)}, (8,))


def test_collate_fixed_shapes(tok):
    a = coat_example(_step(CLICK), tok, IMAGE_CFG)
    b = qa_example(tok, IMAGE_CFG, _image(200, 60, seed=3), "Where is OK?", "Top left.")
    batch = collate(
        [a, b], token_buckets=(64, 128, 256, 512), patch_buckets=(64, 128, 256), pad_id=tok.ids.pad, batch_size=3
    )
    t = smallest_bucket(max(len(a), len(b)), (64, 128, 256, 512))
    assert batch.input_ids.shape == batch.loss_mask.shape == batch.turn_index.shape == (3, t)
    assert batch.attention_mask.dtype == bool and batch.attention_mask.sum(1).tolist() == [len(a), len(b), 0]
    np.testing.assert_array_equal(batch.input_ids[0, : len(a)], a.input_ids)
    assert np.all(batch.input_ids[1, len(b) :] == tok.ids.pad) and np.all(batch.loss_mask[2] == 0)
    n = len(a.pixel_values) + len(b.pixel_values)
    assert batch.pixel_values.shape == (smallest_bucket(n, (64, 128, 256)), 1176) and batch.patch_mask.sum() == n
    pv, grid = batch.packed_images()
    np.testing.assert_array_equal(pv, np.concatenate([a.pixel_values, b.pixel_values]))
    np.testing.assert_array_equal(grid, np.concatenate([a.image_grid_thw, b.image_grid_thw]))
    assert batch.image_mask.tolist() == [True, True, False]
    with pytest.raises(ValueError, match="token length of example ep1/2"):
        collate([a], token_buckets=(16,), patch_buckets=(256,), pad_id=0)
