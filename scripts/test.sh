#!/usr/bin/env bash
# The test command: installs what it needs, makes sure PostgreSQL and Redis are up, type-checks,
# lints, then runs the whole suite on PostgreSQL with real Celery workers and a real ASGI server.
# Extra arguments go to pytest (e.g. scripts/test.sh -k recovery).
# The suite runs with the examples installed (tests/testenv.py sets INSTALL_EXAMPLES=1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_venv "[test]"
ensure_chromium
ensure_postgres
ensure_redis

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/durable}"
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy"
.venv/bin/mypy
echo "==> pytest"
exec .venv/bin/pytest "$@"
