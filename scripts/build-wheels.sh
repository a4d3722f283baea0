#!/usr/bin/env bash
# scripts/build-wheels.sh [OUT [PIP-DOWNLOAD-OPTIONS...]]
# Build Lockstep's two wheels into dist/ (or OUT):
#   lockstep-<v>-py3-none-any.whl        the server (`pip install .` builds the same)
#   lockstep_agent-<v>-py3-none-any.whl  the agent and the `lockstep` command line, for training images
# plus the wheels of the agent's own dependencies (msgspec; websockets for `lockstep-agent[cli]`)
# for this machine's Python and platform (or those the options name, e.g. `--python-version 3.12`),
# so the folder installs offline:
#   pip install --no-index --find-links dist lockstep-agent
# The build backend (hatchling, pinned in the pyproject files) comes from PyPI into pip's isolated
# build environment; nothing else is fetched. PYTHON picks the interpreter (default .venv/bin/python,
# else python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$root/dist}")"
shift $(($# > 0 ? 1 : 0))
cd "$root"
python="${PYTHON:-$(if [ -x .venv/bin/python ]; then echo .venv/bin/python; else echo python3; fi)}"
mkdir -p "$out"
"$python" -m pip wheel --no-deps --wheel-dir "$out" . ./packaging/agent
agent=$(ls -t "$out"/lockstep_agent-*.whl | head -n 1)
"$python" -m pip download --only-binary=:all: --dest "$out" "$@" "$agent[cli]"
ls -1 "$out"
