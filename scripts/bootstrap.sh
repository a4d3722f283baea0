#!/usr/bin/env bash
# Create .venv (if needed) and install the pinned requirements into it.
# Usage: scripts/bootstrap.sh [requirements file]   (default: requirements.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
reqs="${1:-requirements.txt}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp_of() { echo ".venv/.installed-$(sha256sum "$1" requirements.txt | sha256sum | cut -c1-16)"; }
stamp="$(stamp_of "$reqs")"
# requirements-dev.txt starts with `-r requirements.txt`: a development install holds the runtime one
if [ "$reqs" = requirements.txt ] && [ -f "$(stamp_of requirements-dev.txt)" ]; then
  stamp="$(stamp_of requirements-dev.txt)"
fi
if [ ! -f "$stamp" ]; then
  echo "[bootstrap] installing $reqs"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q --no-compile -r "$reqs"
  # pip compiles the bytecode one file at a time (over half of the install); compileall uses every core.
  # A few packages ship files for other Python versions that never compile: their errors are expected.
  .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
  touch "$stamp"
fi
[ -x .venv/bin/lockstep ] || scripts/cli-shim.sh .venv
