#!/usr/bin/env bash
# The run command: the whole system on the embedded default (an SQLite file in var/, Redis on
# localhost): migrations, demo data, the ASGI server, a Celery worker and beat, each restarted if it
# exits (scripts/supervise.sh). Ctrl-C stops it.
# DATABASE_URL=postgres://... runs it on PostgreSQL instead; PORT changes the HTTP port (8000),
# SANDBOX_PORT the sandbox payment provider's (8765).
# The examples (the demo, refunds, supplier assessments, and the sandbox payment provider the
# refunds call) are on here; INSTALL_EXAMPLES=0 runs the engine alone, without demo data.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_venv ""
ensure_redis
mkdir -p var
ensure_secret_key  # var/secret_key, made once (SECRET_KEY in the environment wins)
PORT="${PORT:-8000}"
SANDBOX_PORT="${SANDBOX_PORT:-8765}"  # the sandbox payment provider's (with the examples)
export DEBUG="${DEBUG:-1}"
export INSTALL_EXAMPLES="${INSTALL_EXAMPLES:-1}"  # every process below inherits it
export WORKFLOWS_PUBLIC_QUEUE="${WORKFLOWS_PUBLIC_QUEUE-public}"  # set empty: one worker takes them all
export AGENTS_TURN_QUEUE="${AGENTS_TURN_QUEUE-agents}"              # the same
examples_on() { [[ "${INSTALL_EXAMPLES,,}" =~ ^(1|true|yes|on)$ ]]; }

# The sandbox provider and the settings read one SANDBOX_WEBHOOK_SECRET (scripts/common.sh).
if examples_on; then
    ensure_sandbox_webhook_secret
    if [ "$PORT" = "$SANDBOX_PORT" ]; then
        echo "PORT and SANDBOX_PORT are both $PORT: the sandbox payment provider needs a port of its own (SANDBOX_PORT=...)" >&2
        exit 2
    fi
    # The refunds call the sandbox where it runs (unless SANDBOX_PAYMENTS_URL says otherwise).
    export SANDBOX_PAYMENTS_URL="${SANDBOX_PAYMENTS_URL:-http://127.0.0.1:$SANDBOX_PORT}"
fi
WEBHOOK_URL="http://127.0.0.1:$PORT/webhooks/sandbox-payments/"
ensure_port_free "the web server's" "$PORT" PORT
if examples_on; then
    ensure_port_free "the sandbox payment provider's" "$SANDBOX_PORT" SANDBOX_PORT
fi

# prometheus-client's multiprocess mode: every process below writes its metrics to files in this
# folder and daphne's /metrics adds them up; emptied at each start (the values of processes that
# are gone would otherwise count again). With DEBUG on, /metrics needs no token.
export PROMETHEUS_MULTIPROC_DIR="$PWD/var/prometheus"
rm -rf "$PROMETHEUS_MULTIPROC_DIR"
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

.venv/bin/python manage.py migrate --noinput
if examples_on; then
    .venv/bin/python manage.py seed_demo
fi

# Each process runs under scripts/supervise.sh, which starts it again if it exits (a line in its
# log says so): a worker that lost its broker for good, beat, daphne or the sandbox come back.
pids=()
stop() {
    trap - INT TERM EXIT
    echo "==> stopping"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait || true
}
trap stop INT TERM EXIT
supervise() {
    # supervise NAME LOGFILE COMMAND...: a session of its own, so a Ctrl-C reaches only this script
    local name=$1 log=$2
    : >"$log"
    setsid scripts/supervise.sh "$@" &
    pids+=($!)
    echo "==> $name (log: $log, restarted if it exits)"
}

supervise worker var/worker.log .venv/bin/celery -A config worker -c 2 -l INFO --without-gossip --without-mingle
if [ -n "$WORKFLOWS_PUBLIC_QUEUE" ]; then
    # Runs customers start over the API wait on a queue of their own, for a worker of their own: a
    # customer's long runs never hold up refunds, chat turns or the sweeper on the worker above.
    supervise public-worker var/public-worker.log .venv/bin/celery -A config worker -Q "$WORKFLOWS_PUBLIC_QUEUE" \
        -n "public@%h" -c 1 -l INFO --without-gossip --without-mingle
fi
if [ -n "$AGENTS_TURN_QUEUE" ]; then
    # Chat turns too: a chat answers while every process above waits on a slow provider's answer.
    supervise agents-worker var/agents-worker.log .venv/bin/celery -A config worker -Q "$AGENTS_TURN_QUEUE" \
        -n "agents@%h" -c 2 -l INFO --without-gossip --without-mingle
fi
supervise beat var/beat.log .venv/bin/celery -A config beat -l INFO -s var/celerybeat-schedule
if examples_on; then
    # Its webhook secret comes from the environment (SANDBOX_WEBHOOK_SECRET), not the command line.
    supervise sandbox var/sandbox.log .venv/bin/python -m examples.sandbox --port "$SANDBOX_PORT" --data var/sandbox.sqlite3 \
        --webhook-url "$WEBHOOK_URL"
fi
supervise web var/web.log .venv/bin/daphne -b 127.0.0.1 -p "$PORT" config.asgi:application

if examples_on; then
    cat <<INFO

  The system is running (logs in var/web.log, var/worker.log, var/public-worker.log,
  var/agents-worker.log, var/beat.log, var/sandbox.log).

  Sign in          http://127.0.0.1:$PORT/accounts/login/  (alice / alice; her home page / lists her refunds and runs)
  Admin            http://127.0.0.1:$PORT/admin/           (admin / admin)
  API docs         http://127.0.0.1:$PORT/api/docs/
  Runs (API)       http://127.0.0.1:$PORT/api/runs
  Health           http://127.0.0.1:$PORT/healthz, /readyz, /metrics (Prometheus)
  Demo run page    http://127.0.0.1:$PORT/runs/<id>/ with the id seed_demo printed above (alice / alice)

  Payments sandbox http://127.0.0.1:$SANDBOX_PORT/v1/stats        (refund provider; SANDBOX_PAYMENTS_URL)
  Its webhooks     $WEBHOOK_URL  (refund outcomes, signed with SANDBOX_WEBHOOK_SECRET;
                   the outbox: http://127.0.0.1:$SANDBOX_PORT/v1/webhooks; Admin → Webhook deliveries)
  Refunds (API)    POST http://127.0.0.1:$PORT/api/orders/1042/refunds as alice; GET /api/refunds/<id>

  Ctrl-C stops everything.
INFO
else
    cat <<INFO

  The engine is running without the examples (INSTALL_EXAMPLES=0; logs in var/web.log,
  var/worker.log, var/public-worker.log, var/agents-worker.log, var/beat.log). No demo data: make a login with
  DEBUG=1 .venv/bin/python manage.py createsuperuser

  Sign in          http://127.0.0.1:$PORT/accounts/login/
  Admin            http://127.0.0.1:$PORT/admin/
  API docs         http://127.0.0.1:$PORT/api/docs/
  Runs (API)       http://127.0.0.1:$PORT/api/runs
  Health           http://127.0.0.1:$PORT/healthz, /readyz, /metrics (Prometheus)

  Ctrl-C stops everything.
INFO
fi
wait
