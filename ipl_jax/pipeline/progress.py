"""Progress bars (tqdm, with ETA) that stay quiet when output is not a terminal or when IPL_JAX_QUIET is set."""

from __future__ import annotations

import os
import sys


def progress_bar(total: int, desc: str, unit: str = "it", initial: int = 0):
    """A tqdm bar with ETA; ``disable`` when IPL_JAX_QUIET=1 (tests, notebooks that prefer plain logs)."""
    from tqdm.auto import tqdm

    disable = os.environ.get("IPL_JAX_QUIET", "") not in ("", "0")
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, disable=disable,
                file=sys.stderr, mininterval=1.0)
