"""ipl-jax: MobileIPL (iterative preference learning for mobile GUI agents) in JAX/Flax."""

import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

__all__ = ["train_round"]

# The job configs live at the top of the repository (configs/) and installs put them in the package as
# ipl_jax.configs (pyproject's package-dir). Run from a checkout (plain, or an editable install of it), the
# package has no configs/ of its own: ipl_jax.configs is then the checkout's configs/.
_CHECKOUT_CONFIGS = Path(__file__).resolve().parent.parent / "configs"
if not (Path(__file__).parent / "configs" / "__init__.py").is_file() and (_CHECKOUT_CONFIGS / "__init__.py").is_file():
    _spec = importlib.util.spec_from_file_location(
        "ipl_jax.configs", _CHECKOUT_CONFIGS / "__init__.py", submodule_search_locations=[str(_CHECKOUT_CONFIGS)]
    )
    configs = sys.modules["ipl_jax.configs"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(configs)


def __getattr__(name):
    # ``from ipl_jax import train_round`` without importing jax for every ``import ipl_jax`` (PEP 562).
    if name == "train_round":
        from ipl_jax.preference.tdpo import train_round

        return train_round
    raise AttributeError(f"module 'ipl_jax' has no attribute {name!r}")
