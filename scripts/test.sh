#!/usr/bin/env bash
# The test command: installs what it needs, makes sure PostgreSQL, Redis and RabbitMQ are up, lints, then runs
# the type check and the whole suite side by side on PostgreSQL with real Celery workers and a real ASGI server.
# Extra arguments go to pytest (e.g. scripts/test.sh -k recovery).
# The suite runs with the examples installed (tests/testenv.py sets INSTALL_EXAMPLES=1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_venv "[test]"
ensure_chromium
ensure_postgres
ensure_redis
ensure_rabbitmq  # the crash tests on RabbitMQ (workflows/tests/test_broker_rabbitmq.py)

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/durable}"
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy runs alongside pytest, on the core pytest leaves idle while it waits for workers and servers:
# the suite is near CI's 15 minutes, and mypy without a cache takes more than one of them.
echo "==> mypy (in the background; its report follows pytest's)"
mypy_log="$(mktemp)"
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
echo "==> pytest (${SECONDS} s after the start: install, services, ruff)"
status=0
pytest_started=$SECONDS
# Four test processes (pytest-xdist), each with its own test database, queues and servers: most of
# the suite waits on workers, servers and sleeps, so four share the two cores well (on this 2-core
# machine, in one hour: 359 to 378 s with three, 325 with four or five; earlier, 550 s with three
# against 620 to 650 with two). Under four's load, timing tests that held under three failed now
# and then; each was made to hold however loaded the machine is (a live event's order, a chunk's
# flush interval, two refund requests racing). Whole files go to one process
# (--dist loadfile): a module's workers and servers start once, in the order conftest.py gives them
# (--no-loadscope-reorder: the longest file first). PYTEST_WORKERS=0 runs everything in this process.
# --durations: the slowest tests are named at the end, so a run that took longer says where.
.venv/bin/pytest -n "${PYTEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder --durations=15 "$@" || status=$?
pytest_seconds=$((SECONDS - pytest_started))
echo "==> mypy"
if wait "$mypy_pid"; then
    tail -n 1 "$mypy_log"
else
    cat "$mypy_log"
    status=1
fi
rm -f "$mypy_log"
# CI allows 15 minutes for all of this: the figures say where the time went.
echo "==> done in ${SECONDS} s (pytest ${pytest_seconds} s)"
exit "$status"
