#!/usr/bin/env bash
# Put the `lockstep` command line into a virtualenv's bin/ for this checkout (scripts/bootstrap.sh calls it):
# `source .venv/bin/activate` (or .venv/bin/lockstep) then works from any folder, as after `pip install`.
# Usage: scripts/cli-shim.sh VENV
set -euo pipefail
venv="$(cd "$1" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
cat > "$venv/bin/lockstep" <<SHIM
#!/bin/sh
# The lockstep command line of the checkout $root (written by scripts/cli-shim.sh).
PYTHONPATH="$root\${PYTHONPATH:+:\$PYTHONPATH}" exec "$venv/bin/python" -m lockstep_cli "\$@"
SHIM
chmod +x "$venv/bin/lockstep"
