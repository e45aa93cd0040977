#!/usr/bin/env bash
# Install shoal with its test dependencies into .venv and run the fast test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d .venv ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip install -q torch==2.13.0
pip install -q -e '.[test]'
ruff check src tests benchmarks
lint-imports
python -m pytest -q -n 2 -m "not slow" tests
