"""What every benchmark needs around its scenarios: its own database and Redis keys, a Celery worker,
clean-up whatever happens, timing and percentiles, and the table of figures.

A benchmark script puts the project root first on ``sys.path`` (as a script, Python puts bench/
there, where bench/workflows.py would shadow the workflows package), imports from here, and runs::

    with bench_session(args) as session:
        worker = session.start_worker()
        ...
        print_table([Row("figure", ms(seconds), "<= 50 ms", seconds <= 0.050)])

Django is set up inside the session, so project modules are imported inside functions.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tests.support import Worker

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("completed", "failed", "terminated")
CREATED: list[Any] = []  # ids of the runs a bench made (their Redis stream keys are removed at the end)

Statements = dict[str, list[float]]  # a statement's label -> [count, seconds]


# --- arguments and environment -------------------------------------------------------------------
def add_session_arguments(parser: argparse.ArgumentParser, *, database: str, redis: str) -> None:
    """The options every benchmark takes: its worker, its servers, and whether to keep its database."""
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server URL, no database")
    parser.add_argument("--database", default=database, help=f"database to create and drop (default {database})")
    parser.add_argument("--redis", default=redis, help=f"Redis URL (default db {redis.rsplit('/', 1)[-1]})")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")


def parse_phases(parser: argparse.ArgumentParser, text: str, known: set[str]) -> set[str]:
    """The comma-separated phases of ``--phases``; an unknown one is a usage error."""
    phases = {x.strip() for x in text.split(",") if x.strip()}
    unknown = phases - known
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    return phases


def configure_environment(args: argparse.Namespace) -> None:
    """Set before Django reads its settings; the worker processes inherit the same environment."""
    tag = f"bench-{os.getpid()}"
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": f"{args.pg.rstrip('/')}/{args.database}",
            "REDIS_URL": args.redis,
            "WORKFLOWS_QUEUE": tag,
            "WORKFLOWS_MODULES": "bench.workflows",
            "CHANNELS_PREFIX": f"asgi-{tag}",
            # Per-task INFO lines would cost the plain chain (N log lines per run) more than the engine.
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            # Settings refuse to start without one (DEBUG is off here, as in production).
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
        }
    )


def recreate_database(args: argparse.Namespace, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(f"{args.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{args.database}"')


def scratch_key(name: str) -> str:
    """A Redis key of this bench process's own; clean-up removes whatever is left under it."""
    return f"bench:{os.getpid()}:{name}"


# --- waiting on the worker -----------------------------------------------------------------------
def check_running(worker: Worker) -> None:
    if worker.process.poll() is not None:
        raise RuntimeError(f"the worker exited ({worker.process.returncode}):\n{worker.output()[-4000:]}")


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, check: Callable[[], None], interval: float = 0.02
) -> None:
    """Poll ``predicate`` every ``interval`` seconds, failing at once when ``check`` raises (a process
    that should make it true has exited: ``partial(check_running, worker)``, say)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def wait_for_runs(ids: list[Any], worker: Worker, *, status: str | None = None, timeout: float = 600) -> None:
    """Until every run is ``status`` (default: finished); a failed or terminated run is an error."""
    from workflows.models import WorkflowRun

    statuses = (status,) if status else TERMINAL

    def done() -> bool:
        return WorkflowRun.objects.filter(id__in=ids, status__in=statuses).count() == len(ids)

    wait_until(
        done, timeout=timeout, what=f"{len(ids)} runs to be {'/'.join(statuses)}", check=partial(check_running, worker)
    )
    failed = WorkflowRun.objects.filter(id__in=ids, status__in=("failed", "terminated")).first()
    if failed is not None:
        raise RuntimeError(f"run {failed.id} {failed.status}: {failed.error}")


# --- timing --------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in 0..1)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


_SET_COLUMNS = re.compile(r'"(\w+)" = ')


def classify(sql: str) -> str:
    """A short label for a statement: verb, table, and for an UPDATE the columns it sets."""
    words = sql.split()
    verb = words[0].upper()
    text = sql.replace('"', "")
    if verb == "SELECT":
        m = re.search(r"\bFROM (\w+)", text)
        label = f"SELECT {m.group(1) if m else '?'}"
        return label + (" FOR UPDATE" if "FOR UPDATE" in sql else "")
    if verb == "UPDATE":
        head = sql.split(" WHERE ")[0]
        cols = _SET_COLUMNS.findall(head)
        shown = ",".join(cols[:3]) + (",..." if len(cols) > 3 else "")
        return f"UPDATE {words[1].strip(chr(34))} SET {shown}"
    if verb == "INSERT":
        return f"INSERT {words[2].strip(chr(34))}" + (" ON CONFLICT" if "ON CONFLICT" in sql else "")
    if verb == "WITH":
        writes = re.findall(r"\b(UPDATE|INSERT INTO|DELETE FROM) (\w+)", text)
        return "WITH " + ", ".join(f"{v.split()[0]} {t}" for v, t in writes)
    return verb


@contextmanager
def timed_statements(sql: Statements, *, skip: Callable[[], bool] | None = None) -> Iterator[None]:
    """Count and time each statement through Django's default connection into ``sql`` by its
    classify() label (a connection.execute_wrapper: its own cost, ~µs, is in the figures); a
    statement made while ``skip()`` is true is left out."""
    from django.db import connection

    def wrapper(execute: Callable[..., Any], query: str, params: Any, many: bool, context: Any) -> Any:
        if skip is not None and skip():
            return execute(query, params, many, context)
        t0 = time.perf_counter()
        try:
            return execute(query, params, many, context)
        finally:
            entry = sql.setdefault(classify(query), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    with connection.execute_wrapper(wrapper):
        yield


def probe_environment(when: str) -> str:
    """How slow this shared machine is right now: a read round trip, a committed write (its WAL
    flush), and a Redis round trip, 50 each, p50."""
    from django.db import connection

    from workflows.streams import redis_client

    def p50(fn: Callable[[], Any]) -> float:
        samples = []
        for _ in range(50):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return percentile(samples, 0.5)

    client = redis_client()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_probe (id int PRIMARY KEY, n int)")
        cursor.execute("INSERT INTO bench_probe VALUES (1, 0) ON CONFLICT DO NOTHING")
        read = p50(lambda: cursor.execute("SELECT 1"))
        write = p50(lambda: cursor.execute("UPDATE bench_probe SET n = n + 1 WHERE id = 1"))
    ping = p50(client.ping)
    load = os.getloadavg()[0]
    return (
        f"{when}: SELECT 1 {ms(read)}, autocommit UPDATE (WAL flush) {ms(write)}, "
        f"Redis PING {ms(ping)}, load average {load:.2f}"
    )


def server_settings(*names: str) -> list[str]:
    """PostgreSQL's current settings, e.g. ``server_version``, for a report's first line."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join("current_setting(%s)" for _ in names), names)
        row = cursor.fetchone()
    assert row is not None
    return [str(value) for value in row]


# --- CPU accounting: what a unit of work costs, whatever else this shared machine is doing -------
CPU_PARTS = ("worker", "postgres", "redis", "bench")  # what bench/engine.py prints
_CLK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # fields from the 3rd (state) on


def _proc_cpu(pid: int) -> float:
    try:
        fields = _proc_stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime


def _process_tree(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(_proc_stat(int(entry))[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree += frontier
    return tree


class CpuMeter:
    """CPU seconds used by the worker's processes, the given servers' (daphne), this database's
    PostgreSQL backends, the Redis server (all its clients: shared) and this process. Differences of
    two snapshots are one round's cost. A worker stopped at the time counts nothing."""

    def __init__(self, worker: Worker | None = None, servers: Sequence[Any] = ()) -> None:
        self.worker = worker
        self.servers = servers  # objects with .process (tests.support.AsgiServer)

    def snapshot(self) -> dict[str, float]:
        from django.db import connection

        from workflows.streams import redis_client

        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            backends = [row[0] for row in cursor.fetchall()]
        info: Any = redis_client().info("cpu")
        own = os.times()
        worker = self.worker.process.pid if self.worker is not None and self.worker.process.poll() is None else None
        return {
            "worker": sum(_proc_cpu(pid) for pid in _process_tree(worker)) if worker else 0.0,
            "servers": sum(_proc_cpu(server.process.pid) for server in self.servers),
            "postgres": sum(_proc_cpu(pid) for pid in backends),
            "redis": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
            "bench": own.user + own.system,
        }

    @staticmethod
    def per_unit(before: dict[str, float], after: dict[str, float], units: int) -> dict[str, float]:
        return {part: max(0.0, after[part] - before[part]) / units for part in before}


@contextmanager
def no_collector_pauses() -> Iterator[None]:
    """While a client in this process sends load and times it: no pause of Python's cyclic garbage
    collector. The objects made so far are frozen (out of its generations) and collection is off
    until the block ends, then on again with them unfrozen.

    A load client that pauses sends late, and a latency counted from when a request was due puts
    the client's pause on the server. bench/inbound.py's paced part showed a stall of about 200 ms
    at the same moment of every run, from this process's full collections over Django and the
    prepared requests: the p99 at 500 webhooks a second read 100 to 160 ms with it, 17 to 40 ms
    without (the servers' CPU a request unchanged)."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


# --- output --------------------------------------------------------------------------------------
def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Row:
    figure: str
    value: str
    target: str = ""
    ok: bool | None = None


def print_table(rows: list[Row]) -> None:
    print(f"\n{'figure':<48} {'value':>16}   {'target':<22} result")
    print("-" * 96)
    for r in rows:
        result = "" if r.ok is None else ("PASS" if r.ok else "MISS")
        print(f"{r.figure:<48} {r.value:>16}   {r.target:<22} {result}")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"


# --- the session: set up, and undone whatever happens --------------------------------------------
class Session:
    """What a bench made that must be undone: its worker (stopped; its log kept if the bench failed)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.worker: Worker | None = None

    def start_worker(self, **env: str) -> Worker:
        """One ``celery worker -P prefork -c <--concurrency>`` process group on the bench's own queue,
        ``env`` added to its environment. It logs warnings only: Celery's per-task lines would cost
        the plain chain's N tasks more than a run's one task. At that level it logs no "ready."
        line, so the bench's first runs are what show it up. No beat: the bench times sweeps itself."""
        self.stop_worker()
        env.setdefault("DATABASE_URL", os.environ["DATABASE_URL"])  # with its password, if --pg has one
        self.worker = Worker(concurrency=self.concurrency, beat=False, loglevel="WARNING", **env)
        return self.worker

    def stop_worker(self, *, keep_log: bool = False) -> None:
        if self.worker is None:
            return
        worker, self.worker = self.worker, None
        discard_worker(worker, keep_log=keep_log)


def discard_worker(worker: Worker, *, keep_log: bool = False) -> None:
    """Stop ``worker`` and remove its log, unless it is kept (the bench failed: the log says why)."""
    worker.stop()
    worker.log.close()
    if keep_log:
        say(f"worker log kept: {worker.log.name}")
    else:
        Path(worker.log.name).unlink(missing_ok=True)


def cleanup(args: argparse.Namespace) -> None:
    """Drop the database and the Redis keys this run made (queues, bindings, streams, channel groups,
    scratch keys)."""
    queue = os.environ.get("WORKFLOWS_QUEUE", "")
    try:
        from django.db import connections

        from workflows.streams import redis_client

        client = redis_client()
        keys: list[Any] = []
        for name in (queue, f"{queue}-io"):  # the worker consumes both
            keys += [name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}"]
        keys += [f"wf:run:{run_id.hex}:{part}" for run_id in CREATED for part in ("seq", "events")]
        keys += list(client.scan_iter(match=scratch_key("*"), count=1000))
        keys += list(client.scan_iter(match=f"{os.environ['CHANNELS_PREFIX']}*", count=1000))
        client.delete(*keys)
        connections.close_all()
    except Exception as exc:  # cleanup is best effort; the database is dropped regardless
        say(f"redis cleanup skipped: {exc}")
    if args.keep_db:
        say(f"kept database {args.database}")
    else:
        recreate_database(args, drop_only=True)
        say(f"dropped database {args.database}")


@contextmanager
def bench_session(args: argparse.Namespace) -> Iterator[Session]:
    """The bench's own database, created and migrated, with Django set up; on the way out its
    worker is stopped and its database and Redis keys removed, whether the bench finished or not."""
    configure_environment(args)
    say(f"creating database {args.database}")
    recreate_database(args)
    session, ok = Session(args.concurrency), False
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield session
        ok = True
    finally:
        session.stop_worker(keep_log=not ok)
        cleanup(args)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_main(main: Callable[[], int]) -> None:
    """Run a bench's ``main``. SIGTERM (``kill``, ``pkill``) interrupts it as Ctrl-C does, so its
    servers and worker are stopped and its database dropped instead of left running."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted")
        sys.exit(130)
