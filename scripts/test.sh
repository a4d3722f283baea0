#!/usr/bin/env bash
# README command 2: install into .venv (plus Debian's chromium for the browser tests) and run every test.
# Uses the PostgreSQL and Redis at DATABASE_URL / REDIS_URL (default: 127.0.0.1:5432 and :6379).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh requirements-dev.txt
if ! command -v chromium >/dev/null 2>&1; then
  echo "[test] installing Debian's chromium for the browser tests"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
# Three pytest-xdist workers (LOCKSTEP_TEST_WORKERS, 0 for serial), a file on one worker; each worker has its
# own test database, Redis database and live stack, and every file that uses the database starts with it empty.
# A worker that dies is not replaced (--max-worker-restart 0): the run stops at once, red, naming the test it
# died in. pytest-xdist 3.8's loadfile scheduler hangs or reruns the fatal test after replacing a worker.
exec .venv/bin/python -m pytest -n "${LOCKSTEP_TEST_WORKERS:-3}" --dist loadfile --max-worker-restart 0 "$@"
