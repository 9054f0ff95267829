#!/usr/bin/env bash
# Installs ipl-jax with its test extra into .venv (torch pinned to the CPU build) and runs the test suite.
# Extra arguments go to pytest, e.g. `bash tools/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
