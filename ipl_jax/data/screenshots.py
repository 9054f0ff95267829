"""A step's screenshot as model input: the patch grid known from the image header, the pixels decoded on first
read (``ScreenPixels``) and kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ipl_jax.data.image_processing import ImageProcessorConfig, preprocess_images
from ipl_jax.data.records import DataError, Step


def step_name(step: Step) -> str:
    return f"{step.episode_id}/{step.step_id}"


def step_error(step: Step, field: str, problem: str) -> DataError:
    return DataError(step.meta.get("source", "<step>"), step_name(step), field, problem)


class ScreenPixels:
    """The pixel values f32[N, patch_dim] of a screenshot, computed once on first read by ``load() -> (values,
    grid)``; ``grid`` int64[n, 3] is known up front and a different decoded grid raises.
    """

    def __init__(
        self,
        grid,
        load: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None,
        values: np.ndarray | None = None,
        name: str = "",
    ):
        if (load is None) == (values is None):
            raise ValueError("ScreenPixels: give exactly one of load and values")
        self.grid = np.asarray(grid, np.int64).reshape(-1, 3)
        self.name = name
        self._load, self._values = load, values

    @classmethod
    def given(cls, pixel_values, grid, name: str = "") -> ScreenPixels:
        return cls(grid, values=pixel_values, name=name)

    @property
    def loaded(self) -> bool:
        return self._values is not None

    def values(self) -> np.ndarray:
        if self._values is None:
            pv, grid = self._load()
            if not np.array_equal(np.asarray(grid).reshape(-1, 3), self.grid):
                raise ValueError(
                    f"{self.name or 'screenshot'}: decoded image grid {np.asarray(grid).tolist()} differs from "
                    f"{self.grid.tolist()}, the grid of the size in its header"
                )
            self._values, self._load = pv, None
        return self._values

    def __array__(self, dtype=None, copy=None):
        out = self.values() if dtype is None else self.values().astype(dtype, copy=False)
        return out.copy() if copy else out

    def __repr__(self) -> str:
        return f"ScreenPixels({self.name!r}, grid={self.grid.tolist()}, loaded={self.loaded})"


def decode_pixels(step: Step, image_config: ImageProcessorConfig, image=None, pixels=None):
    """(pixel_values f32[N, patch_dim], grid int64[n, 3]) of a step's screenshot: ``pixels`` ((values, grid))
    as given, else ``image`` (PIL) or the step's own screenshot, preprocessed now."""
    if pixels is not None:
        pv, grid = pixels
        return np.asarray(pv, np.float32), np.asarray(grid, np.int64).reshape(-1, 3)
    if image is None:
        try:
            image = step.load_image()
        except (OSError, ValueError) as e:
            raise step_error(step, "image", f"cannot load the screenshot: {e}") from e
    return preprocess_images([image], config=image_config)


def screen_pixels(step: Step, image_config: ImageProcessorConfig) -> ScreenPixels:
    """A step's screenshot with its grid read now from the image size and its pixels decoded on first read (a
    callable image without ``size`` is loaded now)."""
    try:
        size = step.image_size()
        image = None if size is not None else step.load_image()
    except (OSError, ValueError) as e:
        raise step_error(step, "image", f"cannot load the screenshot: {e}") from e
    width, height = size if size is not None else image.size
    grid = image_config.grid_for(height, width)
    load = functools.partial(decode_pixels, step, image_config, image)
    return ScreenPixels([grid], load=load, name=step_name(step))
