"""``python -m ipl_jax.cli``: the ``ipl-jax`` command."""

import sys

from ipl_jax.cli import main

sys.exit(main())
