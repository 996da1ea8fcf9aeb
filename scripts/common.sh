# Shared by scripts/run.sh and scripts/test.sh: a virtualenv with the project, and the services.

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

ensure_venv() {
    # $1: the extras to install, e.g. "[test]" (empty for the run command)
    local extras="${1:-}"
    local stamp=".venv/.installed${extras}"
    if [ ! -x .venv/bin/python ]; then
        echo "==> creating .venv with $($PYTHON --version)"
        "$PYTHON" -m venv .venv
    fi
    # The test command's install ([test]) holds everything the run command's does.
    if [ -z "$extras" ] && [ -f ".venv/.installed[test]" ] && [ ! pyproject.toml -nt ".venv/.installed[test]" ]; then
        return
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "==> installing the project and its dependencies into .venv"
        .venv/bin/python -m pip install --quiet --upgrade pip
        .venv/bin/python -m pip install --quiet -e ".${extras}"
        touch "$stamp"
    fi
}

ensure_machine_secret() {
    # $1: a variable; $2: its file in var/ (gitignored); $3: Python code that prints a new value.
    # Exports the variable: its value if it is set, else the file's, made the first time, readable
    # by its owner only. It stays the same across restarts and never leaves this machine.
    local name=$1 file=var/$2 make=$3
    if [ -z "${!name:-}" ]; then
        if [ ! -s "$file" ]; then
            mkdir -p var
            (umask 077 && "$PYTHON" -c "$make" >"$file.tmp" && mv "$file.tmp" "$file")
        fi
        printf -v "$name" %s "$(cat "$file")"
    fi
    export "${name?}"
}

ensure_secret_key() {
    # Settings refuse to start with DEBUG off and no SECRET_KEY: sessions and password-reset links
    # stay valid across restarts.
    ensure_machine_secret SECRET_KEY secret_key 'import secrets; print(secrets.token_urlsafe(50))'
}

ensure_sandbox_webhook_secret() {
    # The sandbox provider posts its refunds' outcomes, signed, to this system's webhook source
    # "sandbox-payments": both read the secret from SANDBOX_WEBHOOK_SECRET. Never a secret anyone
    # can read, with which a customer could sign the provider's "refund failed" themselves.
    ensure_machine_secret SANDBOX_WEBHOOK_SECRET sandbox_webhook_secret \
        'import base64, secrets; print("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())'
}

# ensure_port_free NAME PORT VARIABLE: exit 2, saying so, when something listens on 127.0.0.1:PORT
# already (another run of this script, another program): the process started there would fail
# to bind and be restarted for ever, and whatever answers there would be taken for it.
ensure_port_free() {
    if ! .venv/bin/python -c "import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1])))" "$2" 2>/dev/null; then
        echo "port $2 ($1) is taken on 127.0.0.1: stop what listens there, or choose another with $3=..." >&2
        exit 2
    fi
}

ensure_redis() {
    local url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
    if redis-cli -u "$url" ping >/dev/null 2>&1; then
        return
    fi
    command -v redis-server >/dev/null || { echo "Redis is not running and redis-server is not installed" >&2; exit 1; }
    echo "==> starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    for _ in $(seq 50); do redis-cli -u "$url" ping >/dev/null 2>&1 && return; sleep 0.2; done
    echo "Redis did not start" >&2
    exit 1
}

ensure_rabbitmq() {
    # The tests run their most important crash tests on RabbitMQ too (workflows/tests/test_broker_rabbitmq.py);
    # RABBITMQ_TEST_URL names another broker. Started here if it is down, as the machine starts it.
    local url="${RABBITMQ_TEST_URL:-amqp://guest:guest@127.0.0.1:5672//}"
    local hostport="${url#*://}"; hostport="${hostport#*@}"; hostport="${hostport%%/*}"
    local host="${hostport%%:*}" port="${hostport##*:}"
    [ "$port" = "$hostport" ] && port=5672
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
        return
    fi
    command -v rabbitmq-server >/dev/null || { echo "RabbitMQ is not running at $host:$port and rabbitmq-server is not installed" >&2; exit 1; }
    echo "==> starting RabbitMQ"
    rabbitmq-server -detached
    # It boots in a few seconds; rabbitmqctl wait needs a pid file, so poll its port and status.
    for _ in $(seq 120); do
        if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && rabbitmqctl -q status >/dev/null 2>&1; then
            return
        fi
        sleep 0.5
    done
    echo "RabbitMQ did not start" >&2
    exit 1
}

ensure_postgres() {
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
        return
    fi
    command -v pg_ctlcluster >/dev/null || { echo "PostgreSQL is not running and pg_ctlcluster is missing" >&2; exit 1; }
    echo "==> starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
    for _ in $(seq 50); do pg_isready -h 127.0.0.1 -p 5432 -q && return; sleep 0.2; done
    echo "PostgreSQL did not start" >&2
    exit 1
}

ensure_chromium() {
    # Browser tests drive Debian's Chromium through Playwright (Playwright's own download does not
    # work offline).
    if [ -x /usr/bin/chromium ]; then
        return
    fi
    echo "==> installing Debian's chromium for the browser tests"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
}
