#!/usr/bin/env bash
# Runs a command and starts it again whenever it exits, with a line in its log saying so. The run
# command (scripts/run.sh) starts each of its processes through it: a worker or beat that exits
# (a broker away for long, a crash, an out-of-memory kill) comes back by itself. In production a
# service manager does this job (README, "Supervising the processes in production").
#
# Usage: scripts/supervise.sh NAME LOGFILE COMMAND [ARGS...]
# The command's output is appended to LOGFILE. A command that ran less than 10 s before exiting is
# restarted after a pause that doubles each time (SUPERVISE_DELAY seconds at first, at most 30 s);
# one that ran longer, after SUPERVISE_DELAY again. SIGTERM or SIGINT stops the command (SIGTERM,
# waiting for it to finish) and then this script.
set -uo pipefail
name=$1 log=$2
shift 2
first_delay=${SUPERVISE_DELAY:-1}
delay=$first_delay
child=""

stop() {
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    exit 0
}
trap stop TERM INT

while true; do
    started=$SECONDS
    "$@" >>"$log" 2>&1 &
    child=$!
    wait "$child"
    status=$?
    child=""
    if [ $((SECONDS - started)) -ge 10 ]; then
        delay=$first_delay
    fi
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) supervise: $name exited with status $status; restarting in ${delay}s" | tee -a "$log" >&2
    sleep "$delay" &
    child=$!
    wait "$child"
    child=""
    delay=$(awk -v d="$delay" 'BEGIN { d *= 2; print (d > 30 ? 30 : d) }')
done
