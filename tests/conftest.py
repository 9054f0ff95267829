"""Fixtures shared by the test modules. Plain helper functions (model builders, input makers) are in the
``support`` package next to this file, where subprocess scripts can import them too; no test module imports
another test module."""

import jax
import pytest


@pytest.fixture
def highest_precision():
    """Float32 matmuls at full precision for the duration of a test (parity checks at 1e-4 and tighter)."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="session")
def sampler_model():
    """(cfg, params) of the sampler tests' tiny random Qwen2-VL (``support.sampler_models``)."""
    from support.sampler_models import tiny_config, tiny_params

    cfg = tiny_config()
    return cfg, tiny_params(cfg)
