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
# Debian's chromium for the tree viewer's browser test (skipped without it), where missing and apt-get can install
# it: as root, output kept in a log, one line said either way.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log="$(mktemp -t chromium-install.XXXXXX.log)"
  if { timeout 900 apt-get -qq -o DPkg::Lock::Timeout=300 update \
       && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -qq -y -o DPkg::Lock::Timeout=300 install chromium; } \
       >"$log" 2>&1 && command -v chromium >/dev/null 2>&1; then
    echo "installed chromium ($(chromium --version 2>/dev/null | head -n 1)) for the viewer's browser test"
  else
    echo "chromium could not be installed (apt-get log: $log); the viewer's browser test will be skipped"
  fi
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
