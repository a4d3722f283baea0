#!/usr/bin/env bash
# README command 1: install into .venv, then start the whole stack (embedded PostgreSQL and Redis
# unless DATABASE_URL / REDIS_URL are set), a Celery worker and a live 3-rank demo job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh requirements.txt
exec .venv/bin/python manage.py up "$@"
