#!/usr/bin/env bash
# The checks CI runs before the tests: import contracts, ruff (lint, then format), mypy (levels per package:
# docs/testing.md, Type checking).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh requirements-dev.txt >/dev/null
.venv/bin/lint-imports
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
