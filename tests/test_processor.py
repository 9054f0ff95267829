"""Image preprocessing parity against transformers' Qwen2VLImageProcessorPil."""

import json

import numpy as np
import pytest
from PIL import Image

from ipl_jax.data.image_processing import ImageProcessorConfig, num_patches, preprocess_images, smart_resize

MIN_PIXELS = 56 * 56 * 4  # 12544
MAX_PIXELS = 28 * 28 * 64  # 50176


def _random_image(h, w, seed, mode="RGB"):
    rng = np.random.default_rng(seed)
    # smooth-ish content plus noise, so the bicubic filter sees real structure
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx + yy) % 256)], -1)
    noise = rng.integers(0, 60, size=(h, w, 3))
    arr = np.clip(base + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(arr)
    if mode == "RGBA":
        alpha = rng.integers(0, 256, size=(h, w), dtype=np.uint8)
        img = Image.fromarray(np.concatenate([arr, alpha[..., None]], -1), "RGBA")
    return img


def test_smart_resize_known_answers():
    assert smart_resize(480, 640, min_pixels=3136, max_pixels=12845056) == (476, 644)
    assert smart_resize(1080, 1920, max_pixels=1003520) == (728, 1316)
    assert smart_resize(28, 28) == (56, 56)
    with pytest.raises(ValueError):
        smart_resize(10, 2500)


# (height, width): below min_pixels, above max_pixels, non-square portrait / landscape, exact multiple, odd sizes
SIZES = [(20, 30), (700, 500), (224, 224), (100, 333), (413, 97), (56, 84)]


@pytest.mark.parametrize("hw", SIZES)
def test_matches_transformers(hw):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    h, w = hw
    img = _random_image(h, w, seed=h * 1000 + w)
    ref = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)(images=[img])
    pv, grid = preprocess_images([img], min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    assert pv.dtype == np.float32 and grid.dtype == np.int64
    np.testing.assert_array_equal(grid, np.asarray(ref["image_grid_thw"]))
    assert pv.shape == np.asarray(ref["pixel_values"]).shape
    np.testing.assert_allclose(pv, np.asarray(ref["pixel_values"]), atol=1e-6, rtol=0)


def test_size_bounds_are_exercised():
    cfg = ImageProcessorConfig(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    areas = [np.prod(smart_resize(h, w, 28, MIN_PIXELS, MAX_PIXELS)) for h, w in SIZES]
    assert 20 * 30 < MIN_PIXELS and areas[0] >= MIN_PIXELS  # upscaled
    assert 700 * 500 > MAX_PIXELS and areas[1] <= MAX_PIXELS  # downscaled
    assert cfg.grid_for(224, 224) == (1, 16, 16) and cfg.num_image_tokens(224, 224) == 64


def test_several_images_concatenate_and_alpha_matches():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    imgs = [_random_image(90, 150, 1, "RGBA"), _random_image(160, 60, 2), Image.new("L", (70, 70), 128)]
    ref = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)(images=imgs)
    pv, grid = preprocess_images(imgs, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    np.testing.assert_array_equal(grid, np.asarray(ref["image_grid_thw"]))
    np.testing.assert_allclose(pv, np.asarray(ref["pixel_values"]), atol=1e-6, rtol=0)
    assert pv.shape == (num_patches(grid), 3 * 2 * 14 * 14)


def test_config_round_trip_and_v5_size_form(tmp_path):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    cfg = ImageProcessorConfig(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    cfg.save(tmp_path)
    assert ImageProcessorConfig.load(tmp_path) == cfg
    # transformers reads what we write
    hf = Qwen2VLImageProcessorPil.from_pretrained(str(tmp_path))
    assert (hf.size["shortest_edge"], hf.size["longest_edge"]) == (MIN_PIXELS, MAX_PIXELS)
    # v5 form only, and Hub form only
    (tmp_path / "v5.json").write_text(json.dumps({"size": {"shortest_edge": 100, "longest_edge": 5000}}))
    assert ImageProcessorConfig.load(tmp_path / "v5.json").max_pixels == 5000
    (tmp_path / "hub.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056}))
    hub = ImageProcessorConfig.load(tmp_path / "hub.json")
    assert (hub.min_pixels, hub.max_pixels, hub.patch_size) == (3136, 12845056, 14)
    (tmp_path / "bad.json").write_text(json.dumps({"min_pixels": "many"}))
    with pytest.raises(ValueError, match="bad.json.*min_pixels"):
        ImageProcessorConfig.load(tmp_path / "bad.json")
