"""Qwen2-VL image preprocessing in numpy + PIL, identical to transformers' ``Qwen2VLImageProcessorPil``: RGB,
bicubic resize to ``smart_resize``, rescale, CLIP normalisation, patchify merge block by merge block.
Images of one call are concatenated along the patch axis.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)  # Qwen3-VL's mean and std
NORMALISATION = {"qwen3_vl": (HALF, HALF)}  # a family's (mean, std); the others: CLIP's
# A processor field and the model config's (vision_config) field it must equal.
MODEL_FIELDS = {
    "patch_size": "patch_size",
    "merge_size": "spatial_merge_size",
    "temporal_patch_size": "temporal_patch_size",
}

# The values in the published Qwen2-VL preprocessor_config.json files (not the class default max of 1003520).
HUB_MIN_PIXELS = 3136
HUB_MAX_PIXELS = 12845056

PREPROCESSOR_CONFIG = "preprocessor_config.json"


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
    """The (height, width) an image is resized to: multiples of ``factor``, area in [min_pixels, max_pixels], aspect
    ratio kept as closely as possible. Raises ValueError for an aspect ratio above 200."""
    if height <= 0 or width <= 0:
        raise ValueError(f"smart_resize: image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"smart_resize: aspect ratio must be at most 200, got {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
    """The fields of a Qwen2-VL ``preprocessor_config.json`` that change the pixels."""

    min_pixels: int = HUB_MIN_PIXELS
    max_pixels: int = HUB_MAX_PIXELS
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def grid_for(self, height: int, width: int) -> tuple[int, int, int]:
        """The (t, h, w) patch grid of an image of ``height`` x ``width`` pixels."""
        rh, rw = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return 1, rh // self.patch_size, rw // self.patch_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """How many ``<|image_pad|>`` tokens (merged patches) an image of that size becomes."""
        t, h, w = self.grid_for(height, width)
        return t * h * w // (self.merge_size**2)

    # ----------------------------------------------------------------------------------------- json

    @staticmethod
    def from_dict(d: dict, source: str = "<dict>") -> ImageProcessorConfig:
        """Read the Hub form (``min_pixels``/``max_pixels``) or transformers-5's ``size`` form; explicit min/max win."""
        size = d.get("size") or {}
        if not isinstance(size, dict):
            raise ValueError(f"{source}: field 'size': expected a dict, got {size!r}")
        min_pixels = d.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", HUB_MIN_PIXELS)))
        max_pixels = d.get("max_pixels", size.get("longest_edge", size.get("max_pixels", HUB_MAX_PIXELS)))
        kw: dict[str, Any] = dict(min_pixels=min_pixels, max_pixels=max_pixels)
        for name in ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std"):
            if d.get(name) is not None:
                kw[name] = d[name]
        for name in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
            v = kw.get(name)
            if v is not None and (not isinstance(v, (int, float)) or int(v) != v or v <= 0):
                raise ValueError(f"{source}: field {name!r}: expected a positive integer, got {v!r}")
            if v is not None:
                kw[name] = int(v)
        for name in ("image_mean", "image_std"):
            if name in kw:
                v = kw[name]
                if not isinstance(v, (list, tuple)) or len(v) != 3:
                    raise ValueError(f"{source}: field {name!r}: expected 3 numbers, got {v!r}")
                kw[name] = tuple(float(x) for x in v)
        if kw["min_pixels"] > kw["max_pixels"]:
            raise ValueError(f"{source}: min_pixels {kw['min_pixels']} > max_pixels {kw['max_pixels']}")
        return ImageProcessorConfig(**kw)

    def to_dict(self) -> dict:
        """A ``preprocessor_config.json`` readable by transformers 4.x and 5.x (both size forms are written)."""
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "do_resize": True,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "do_convert_rgb": True,
            "resample": 3,  # PIL bicubic
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
        }

    @staticmethod
    def load(path: str | Path) -> ImageProcessorConfig:
        """Read ``preprocessor_config.json`` from a checkpoint directory (or the file itself)."""
        p = Path(path)
        if p.is_dir():
            p = p / PREPROCESSOR_CONFIG
        if not p.is_file():
            raise FileNotFoundError(f"no image processor config at {p}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON: {e}") from e
        if not isinstance(d, dict):
            raise ValueError(f"{p}: expected a JSON object")
        return ImageProcessorConfig.from_dict(d, source=str(p))

    @staticmethod
    def for_model(cfg, min_pixels: int = HUB_MIN_PIXELS, max_pixels: int = HUB_MAX_PIXELS) -> ImageProcessorConfig:
        """The processor a model of config ``cfg`` (a ``Qwen2VLConfig``) reads: its vision tower's patch, merge
        and temporal sizes, its family's normalisation (``NORMALISATION``)."""
        mean, std = NORMALISATION.get(cfg.model_type, (CLIP_MEAN, CLIP_STD))
        v = cfg.vision
        return ImageProcessorConfig(
            min_pixels, max_pixels, v.patch_size, v.spatial_merge_size, v.temporal_patch_size, mean, std
        )

    def check_model(self, vision, source: str) -> None:
        """ValueError naming ``source`` and the field when a patch size disagrees with the model's ``vision``
        config (a ``VisionConfig``): such pixels would not fit the patch embedding."""
        for name, model_name in MODEL_FIELDS.items():
            mine, model = getattr(self, name), getattr(vision, model_name)
            if mine != model:
                raise ValueError(
                    f"{source}: field {name!r} is {mine}, the model's (config.json vision_config.{model_name}) {model}"
                )

    @staticmethod
    def load_for_model(directory: str | Path, cfg) -> ImageProcessorConfig:
        """A checkpoint directory's processor (``ImageProcessorConfig.for_model(cfg)`` when it has none), checked
        against its model config ``cfg`` (``check_model``) before any weight is read."""
        p = Path(directory) / PREPROCESSOR_CONFIG
        if not p.is_file():
            return ImageProcessorConfig.for_model(cfg)
        out = ImageProcessorConfig.load(p)
        out.check_model(cfg.vision, str(p))
        return out

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        out = d / PREPROCESSOR_CONFIG
        out.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return out


# ---------------------------------------------------------------------------------------------- pixels


def to_rgb(image: Image.Image | np.ndarray) -> Image.Image:
    """A PIL RGB image, transparency composited onto white; numpy input must be uint8 [H, W] or [H, W, 1|3|4]."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise ValueError(f"image array must be uint8 [H, W, C], got dtype {image.dtype}")
        if image.ndim == 3 and image.shape[-1] == 1:
            image = image[..., 0]
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] not in (3, 4)):
            raise ValueError(f"image array must be [H, W], [H, W, 3] or [H, W, 4], got shape {image.shape}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL image or a uint8 array, got {type(image).__name__}")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _patchify(chw: np.ndarray, cfg: ImageProcessorConfig) -> np.ndarray:
    """float32[C, H, W] -> float32[(H/p)*(W/p), C*T*p*p], rows grouped by merge block."""
    c, h, w = chw.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = h // p, w // p
    x = chw.reshape(c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
    return np.ascontiguousarray(x).reshape(gh * gw, c * t * p * p)


def preprocess_image(
    image: Image.Image | np.ndarray, cfg: ImageProcessorConfig
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (pixel_values float32[h*w, patch_dim], grid (1, h, w)) with h, w in patches."""
    rgb = to_rgb(image)
    rh, rw = smart_resize(rgb.height, rgb.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    resized = np.asarray(rgb.resize((rw, rh), resample=Image.Resampling.BICUBIC))  # uint8[H, W, 3]
    chw = np.moveaxis(resized, -1, 0)
    x = (chw.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, dtype=np.float32)[:, None, None]
    x = (x - mean) / std
    return _patchify(x, cfg), (1, rh // cfg.patch_size, rw // cfg.patch_size)


def preprocess_images(
    images: Image.Image | np.ndarray | Sequence[Any],
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    config: ImageProcessorConfig | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Images -> (pixel_values float32[N, 3*T*p*p], image_grid_thw int64[n, 3]), N = sum of h*w in patches.

    Pass ``config`` or the individual fields (unset min/max_pixels: the Hub's 3136 / 12845056).
    """
    if config is None:
        config = ImageProcessorConfig(
            min_pixels=HUB_MIN_PIXELS if min_pixels is None else int(min_pixels),
            max_pixels=HUB_MAX_PIXELS if max_pixels is None else int(max_pixels),
            patch_size=patch_size,
            merge_size=merge_size,
            temporal_patch_size=temporal_patch_size,
        )
    if isinstance(images, (Image.Image, np.ndarray)):
        images = [images]
    images = list(images)
    if not images:
        return np.zeros((0, config.patch_dim), np.float32), np.zeros((0, 3), np.int64)
    patches, grids = [], []
    for img in images:
        pv, grid = preprocess_image(img, config)
        patches.append(pv)
        grids.append(grid)
    return np.concatenate(patches, axis=0), np.asarray(grids, dtype=np.int64)


def num_patches(image_grid_thw: Iterable[Sequence[int]]) -> int:
    """Total number of patch rows for the given grids."""
    return int(sum(int(t) * int(h) * int(w) for t, h, w in image_grid_thw))
