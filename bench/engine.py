#!/usr/bin/env python
"""Benchmark of the durable workflow engine against a plain Celery chain (not a test: it prints).

    .venv/bin/python bench/engine.py [--runs M] [--steps N] [--rounds R] [--waiters K] ...
    .venv/bin/python bench/engine.py --workers 1,2,4        # throughput by worker process count only

It creates its own PostgreSQL database (dropped at the end), migrates it, starts one Celery worker
with two prefork processes on a queue of its own, and measures, in one run:

1. durable steps per second: M runs of N no-op steps, each started in its own commit, until the last finishes;
2. the baseline: M plain Celery chains of N no-op tasks on the same worker, broker and settings;
3. per-step overhead: from the step rows of (1), the gap between one step's body and the next's;
4. event-to-resume latency: send_event until the step after wait_for_event starts;
5. a sweep's duration with 200,000 finished runs in the table;
6. where the time goes: the same runs advanced in this process with every SQL statement timed.

The figures, their targets and PASS/MISS are printed as a table. It always exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/workflows.py would shadow the
# workflows package: the project root goes there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import (  # noqa: E402
    CPU_PARTS,
    CREATED,
    TERMINAL,
    CpuMeter,
    Row,
    Session,
    Statements,
    add_session_arguments,
    bench_session,
    check_running,
    median,
    ms,
    parse_phases,
    percentile,
    print_table,
    probe_environment,
    run_main,
    say,
    scratch_key,
    server_settings,
    timed_statements,
    wait_for_runs,
    wait_until,
)
from tests.support import Worker  # noqa: E402

PHASES = {"throughput", "async", "events", "breakdown", "sweep"}


# --- arguments -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", "-M", type=int, default=100, help="runs (and chains) per round (default 100)")
    p.add_argument("--steps", "-N", type=int, default=20, help="no-op steps (and tasks) per run (default 20)")
    p.add_argument(
        "--rounds", type=int, default=3, help="durable/plain rounds, alternated; medians reported (default 3)"
    )
    p.add_argument("--waiters", "-K", type=int, default=200, help="runs waiting for an event (default 200)")
    p.add_argument(
        "--event-interval",
        type=float,
        default=0.05,
        help="seconds between two send_event calls (default 0.05: 20 events/s)",
    )
    p.add_argument("--finished", type=int, default=200_000, help="finished runs in the table for the sweep")
    p.add_argument("--sweeps", type=int, default=30, help="sweeps timed (default 30)")
    p.add_argument("--breakdown-runs", type=int, default=30, help="runs advanced in-process for the breakdown")
    p.add_argument(
        "--phases",
        default="throughput,async,events,breakdown,sweep",
        help="comma-separated subset of throughput,async,events,breakdown,sweep (default all); "
        "async: one more durable and plain round with WORKFLOWS_STEP_COMMIT=async workers",
    )
    p.add_argument("--profile", action="store_true", help="also print a cProfile of the in-process breakdown")
    p.add_argument(
        "--workers",
        default="",
        help="scaling only: comma-separated worker process counts, e.g. 1,2,4: for each, one celery worker "
        "-P prefork -c <count> and --rounds durable and plain rounds; prints steps/s by count",
    )
    add_session_arguments(p, database="durable_bench", redis="redis://127.0.0.1:6379/6")
    args = p.parse_args(argv)
    try:
        args.workers = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        p.error("--workers is a comma-separated list of process counts, e.g. 1,2,4")
    if any(count < 1 for count in args.workers):
        p.error("--workers: each count must be at least 1")
    if args.steps < 1 or args.runs < 1 or args.rounds < 1:
        p.error("--runs, --steps and --rounds must be at least 1")
    args.phases = parse_phases(p, args.phases, PHASES)
    return args


# --- durable runs and plain chains ---------------------------------------------------------------
def start_runs(workflow: str, payload: dict[str, Any], count: int) -> list[Any]:
    """``count`` runs, each started in its own commit as a client would: a run's enqueue leaves
    when its start() commits, so workers begin while later runs are still being started (as
    the plain chains are sent in a loop)."""
    from workflows import public as wf

    ids = [wf.start(workflow, payload).id for _ in range(count)]
    CREATED.extend(ids)
    return ids


def durable_round(runs: int, steps: int, worker: Worker) -> tuple[float, list[Any]]:
    """Seconds from before the first start() until the last run finished (its finished_at)."""
    from django.db.models import Max

    from workflows.models import WorkflowRun

    t0 = time.time()
    ids = start_runs("bench.noop", {"steps": steps}, runs)
    wait_for_runs(ids, worker)
    end = WorkflowRun.objects.filter(id__in=ids).aggregate(end=Max("finished_at"))["end"]
    return end.timestamp() - t0, ids


def plain_round(runs: int, steps: int, worker: Worker, key: str) -> float:
    """Seconds from before the first chain is sent until the last chain's last task ran."""
    from celery import chain

    from bench.workflows import noop_task
    from workflows.streams import redis_client

    client = redis_client()
    client.delete(key)
    t0 = time.time()
    for _ in range(runs):
        tasks = [noop_task.si() for _ in range(steps - 1)] + [noop_task.si(key)]
        chain(*tasks).apply_async()
    wait_until(
        lambda: client.llen(key) >= runs, timeout=600, what=f"{runs} chains", check=partial(check_running, worker)
    )
    end = max(float(v) for v in client.lrange(key, 0, -1))
    client.delete(key)
    return end - t0


@dataclass
class Overhead:
    gaps: list[float] = field(default_factory=list)  # seconds between a body's end and the next body's start
    bodies: list[float] = field(default_factory=list)  # the no-op bodies themselves
    per_run: list[float] = field(default_factory=list)  # claim + load + finish: run time not between bodies


def step_overhead(ids: list[Any]) -> Overhead:
    """From the stored rows: started_at is taken after the step boundary (lease check), finished_at
    right after the body, before the result is written. So started_at[i] - finished_at[i-1] is all
    the engine does between two bodies: write step i-1's result, replay to step i, check the lease.
    Both clocks are the same worker process's."""
    from workflows.models import StepResult, WorkflowRun

    out = Overhead()
    # Every row here is a completed no-op step: both timestamps are set (Any: the stubs say Optional).
    rows: Any = (
        StepResult.objects.filter(run_id__in=ids)
        .order_by("run_id", "position")
        .values_list("run_id", "started_at", "finished_at")
    )
    by_run: dict[Any, list[tuple[Any, Any]]] = defaultdict(list)
    for run_id, started, finished in rows:
        by_run[run_id].append((started, finished))
        out.bodies.append((finished - started).total_seconds())
    runs: Any = WorkflowRun.objects.filter(id__in=ids).values_list("id", "started_at", "finished_at")
    spans = {run_id: (started, finished) for run_id, started, finished in runs}
    for run_id, steps in by_run.items():
        for (_, prev_end), (start, _) in zip(steps, steps[1:]):
            out.gaps.append((start - prev_end).total_seconds())
        inside = (steps[-1][1] - steps[0][0]).total_seconds()
        run_started, run_finished = spans[run_id]
        out.per_run.append((run_finished - run_started).total_seconds() - inside)
    return out


# --- event to resume -----------------------------------------------------------------------------
def event_latencies(waiters: int, interval: float, worker: Worker) -> tuple[list[float], list[float]]:
    """Runs parked in wait_for_event; the step after the wait returns time.time() as its body starts.
    Latency = that minus time.time() just before send_event(). Returns (one at a time, open loop):
    first a quarter as many runs get their event only once the previous one has completed (the
    resume path alone); then ``waiters`` runs get one event every ``interval`` s, whatever the
    workers' backlog (the figure with targets)."""
    from bench.workflows import WAIT_EVENT
    from workflows import public as wf
    from workflows.models import WorkflowRun

    single = max(10, waiters // 4)
    ids = start_runs("bench.wait", {}, single + waiters)
    wait_for_runs(ids, worker, status="waiting", timeout=120)
    sent: dict[Any, float] = {}
    for run_id in ids[:single]:
        sent[run_id] = time.time()
        wf.send_event(run_id, WAIT_EVENT, {})
        completed = WorkflowRun.objects.filter(pk=run_id, status="completed")
        wait_until(completed.exists, timeout=60, what=f"run {run_id} to resume", check=partial(check_running, worker))
    next_at = time.monotonic()
    for run_id in ids[single:]:
        sent[run_id] = time.time()
        wf.send_event(run_id, WAIT_EVENT, {})
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    wait_for_runs(ids, worker, timeout=120)
    results: dict[Any, Any] = dict(WorkflowRun.objects.filter(id__in=ids).values_list("id", "result"))
    latencies = [results[run_id] - sent[run_id] for run_id in ids]
    return latencies[:single], latencies[single:]


# --- the sweep -----------------------------------------------------------------------------------
def fill_finished_runs(count: int) -> float:
    """``count`` finished runs (94% completed, 5% failed, 1% terminated) and 1,000 runs waiting for an
    event a day away (not due), each set by one INSERT .. SELECT generate_series, then ANALYZE.

    Columns come from the model, so a field added later gets its default: every column not named in
    ``varying`` takes a template run's value."""
    from django.conf import settings
    from django.db import connection

    from workflows.models import WorkflowRun

    def insert(template: WorkflowRun, varying: dict[str, str], rows: int) -> None:
        columns, exprs, params = [], [], []
        for f in WorkflowRun._meta.concrete_fields:
            assert f.column is not None
            columns.append(connection.ops.quote_name(f.column))
            if f.column in varying:
                exprs.append(varying[f.column])
            else:
                exprs.append("%s")
                params.append(f.get_db_prep_save(getattr(template, f.attname), connection))
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {WorkflowRun._meta.db_table} ({', '.join(columns)}) SELECT {', '.join(exprs)} "
                f"FROM generate_series(1, {int(rows)}) AS g, "
                f"LATERAL (SELECT now() - g * interval '13 seconds' AS t) AS x",
                params,
            )

    queue = settings.WORKFLOWS["QUEUE"]
    finished = WorkflowRun(workflow="bench.noop", workflow_version="1", payload={"steps": 10}, attempt=1)
    waiting = WorkflowRun(
        workflow="bench.wait", workflow_version="1", payload={}, attempt=1, wait_event_type="bench.go", wait_step="wait"
    )
    for template in (finished, waiting):
        if hasattr(template, "queue"):
            template.queue = queue
    t0 = time.perf_counter()
    failed, terminated = "mod(g, 20) = 0", "mod(g, 100) = 0"
    insert(
        finished,
        {
            "id": "gen_random_uuid()",
            "status": f"CASE WHEN {terminated} THEN 'terminated' WHEN {failed} THEN 'failed' ELSE 'completed' END",
            "result": f"CASE WHEN {failed} THEN NULL ELSE '10'::jsonb END",
            "error": f"""CASE WHEN {failed} AND NOT {terminated} THEN '{{"type": "ValueError"}}'::jsonb END""",
            "failure_reason": f"CASE WHEN {failed} AND NOT {terminated} THEN 'error' ELSE '' END",
            "enqueued_at": "t",
            "created_at": "t",
            "started_at": "t",
            "updated_at": "t + interval '2 seconds'",
            "finished_at": "t + interval '2 seconds'",
        },
        count,
    )
    insert(
        waiting,
        {
            "id": "gen_random_uuid()",
            "status": "'waiting'",
            "wake_at": "now() + interval '1 day'",
            "enqueued_at": "t",
            "created_at": "t",
            "started_at": "t",
            "updated_at": "t",
        },
        1000,
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {WorkflowRun._meta.db_table}")
    return time.perf_counter() - t0


def time_sweeps(count: int) -> tuple[list[float], list[str]]:
    """Seconds per sweep() call, and the plan of each query one sweep makes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workflows.sweeper import sweep

    durations = []
    for _ in range(count):
        t0 = time.perf_counter()
        report = sweep()
        durations.append(time.perf_counter() - t0)
        if report.timers_fired or report.requeued:
            raise RuntimeError(f"the sweep found work in a table that should have none: {report}")
    with CaptureQueriesContext(connection) as captured:
        sweep()
    plans = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING ON, SUMMARY OFF) " + query["sql"])
            lines = [row[0].strip() for row in cursor.fetchall()]
            scans = [ln for ln in lines if "Scan" in ln]
            plans.append("; ".join(scans or lines[:1]))
    return durations, plans


# --- where the time goes: in-process breakdown ---------------------------------------------------
@dataclass
class Breakdown:
    steps: int
    runs: int
    seconds: float
    cpu: float  # CPU seconds this process used (the advancing thread and any helper threads)
    sql: Statements
    publish: list[float]  # [count, seconds] of publish_status (SELECT + Redis + Channels)
    group_send: list[float]  # [count, seconds] of its async_to_sync(channel_layer.group_send)
    gaps: list[float]

    @property
    def sql_seconds(self) -> float:
        return sum(v[1] for v in self.sql.values())


def create_unqueued_runs(count: int, steps: int) -> list[Any]:
    """Runs created directly, with no enqueue: this process advances them, not the worker."""
    from django.utils import timezone

    from workflows.models import RunAttempt, WorkflowRun

    ids = []
    for _ in range(count):
        run = WorkflowRun.objects.create(
            workflow="bench.noop", workflow_version="1", payload={"steps": steps}, enqueued_at=timezone.now()
        )
        RunAttempt.objects.create(run=run, number=1)
        ids.append(run.id)
    CREATED.extend(ids)
    return ids


def _timed(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    """``fn`` adding its calls and seconds to ``into`` when called on the advancing (main) thread;
    into[2] is 1 while it runs there."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)  # off the advancing path: not this table's business
        t0 = time.perf_counter()
        into[2] = 1
        try:
            return fn(*args, **kwargs)
        finally:
            into[2] = 0
            into[0] += 1
            into[1] += time.perf_counter() - t0

    return call


@contextmanager
def timed_commits(sql: Statements) -> Iterator[None]:
    """Count the COMMIT that ends each atomic() block (autocommit statements commit inside their own
    time; a transaction's BEGIN is sent by psycopg inside its first statement's time)."""
    from django.db import connections

    wrapper = connections["default"]
    original = getattr(wrapper, "_commit")  # noqa: B009 (private: the one place every atomic() commits)

    def commit() -> None:
        t0 = time.perf_counter()
        try:
            original()
        finally:
            entry = sql.setdefault("COMMIT (end of an atomic block)", [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    setattr(wrapper, "_commit", commit)  # noqa: B010
    try:
        yield
    finally:
        delattr(wrapper, "_commit")


@contextmanager
def timed_publish(publish: list[float], group_send: list[float]) -> Iterator[None]:
    """Time what status pushes cost the advancing thread: the hand-off to the publisher thread
    (emit_status -> publish_later). The Redis write and the Channels send happen on that thread,
    off the path between steps; ``group_send`` stays empty."""
    from workflows import streams

    original = streams.publish_later
    streams.publish_later = _timed(original, publish)
    try:
        yield
    finally:
        streams.publish_later = original


def breakdown(
    runs: int, steps: int, *, synchronous_commit: bool = True, profiler: cProfile.Profile | None = None
) -> Breakdown:
    """Advance ``runs`` runs in this process (workers idle) with every SQL statement timed."""
    from django.db import connection

    from workflows import engine

    ids = create_unqueued_runs(runs, steps)
    sql: Statements = {}
    publish = [0, 0.0, 0]
    group_send = [0, 0.0, 0]

    def elsewhere() -> bool:
        """publish_status's own SELECT is counted in its row; other threads are off the advancing path."""
        return bool(publish[2]) or threading.current_thread() is not threading.main_thread()

    with connection.cursor() as cursor:
        cursor.execute(f"SET synchronous_commit TO {'on' if synchronous_commit else 'off'}")
    try:
        with timed_statements(sql, skip=elsewhere), timed_publish(publish, group_send), timed_commits(sql):
            if profiler:
                profiler.enable()
            t0, c0 = time.perf_counter(), time.process_time()
            for run_id in ids:
                outcome = engine.advance(run_id)
                if outcome != "completed":
                    raise RuntimeError(f"in-process advance of {run_id} ended {outcome!r}")
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            if profiler:
                profiler.disable()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit TO on")
    return Breakdown(steps, runs, seconds, cpu, sql, publish, group_send, step_overhead(ids).gaps)


def print_breakdown(b: Breakdown, title: str) -> None:
    total_steps = b.steps * b.runs
    sql_seconds = b.sql_seconds
    print(f"\n{title}")
    print(
        f"  {b.runs} runs x {b.steps} steps advanced in this process: {b.seconds * 1000 / total_steps:.3f} ms "
        f"per step all in ({b.seconds * 1000 / b.runs:.2f} ms per run); between-body gap "
        f"p50 {percentile(b.gaps, 0.5) * 1000:.3f} ms, p99 {percentile(b.gaps, 0.99) * 1000:.3f} ms"
    )
    print(
        f"  CPU of this (advancing) process: {b.cpu * 1000 / total_steps:.3f} ms per step all in "
        f"({b.cpu * 1000 / b.runs:.2f} ms per run)"
    )
    print(f"  {'statement':<62} {'per run':>8} {'mean ms':>8} {'ms/run':>8}")
    for label, (count, seconds) in sorted(b.sql.items(), key=lambda kv: -kv[1][1]):
        print(
            f"  {label[:62]:<62} {count / b.runs:>8.1f} {seconds * 1000 / count:>8.3f} {seconds * 1000 / b.runs:>8.3f}"
        )
    statements = sum(v[0] for v in b.sql.values())
    other = b.seconds - sql_seconds - b.publish[1]
    label = "= SQL round trips (a BEGIN rides in the first statement)"
    print(f"  {label:<62} {statements / b.runs:>8.1f} {'':>8} {sql_seconds * 1000 / b.runs:>8.3f}")
    if b.publish[0]:
        print(
            f"  {'emit_status -> publish_later (hand-off to the publisher thread)':<62} "
            f"{b.publish[0] / b.runs:>8.1f} {b.publish[1] * 1000 / b.publish[0]:>8.3f} "
            f"{b.publish[1] * 1000 / b.runs:>8.3f}"
        )
    if b.group_send[0]:
        print(
            f"  {'  of which async_to_sync(channel_layer.group_send)':<62} "
            f"{b.group_send[0] / b.runs:>8.1f} {b.group_send[1] * 1000 / b.group_send[0]:>8.3f} "
            f"{b.group_send[1] * 1000 / b.runs:>8.3f}"
        )
    print(
        f"  {'Python (replay, Django ORM, engine; excl. the above)':<62} {'':>8} {'':>8} {other * 1000 / b.runs:>8.3f}"
    )


# --- main ----------------------------------------------------------------------------------------
@dataclass
class Results:
    durable_s: list[float] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    async_durable_s: float = 0.0  # WORKFLOWS_STEP_COMMIT=async, one round
    async_plain_s: float = 0.0
    async_overhead: Overhead | None = None
    durable_cpu: list[dict[str, float]] = field(default_factory=list)  # CPU seconds per step, per round
    plain_cpu: list[dict[str, float]] = field(default_factory=list)  # CPU seconds per task, per round
    overhead: Overhead | None = None
    latencies: list[float] = field(default_factory=list)  # open loop, the figure with targets
    single_latencies: list[float] = field(default_factory=list)  # one event at a time
    inproc: Breakdown | None = None
    inproc_async: Breakdown | None = None
    sweeps: list[float] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)
    fill_seconds: float = 0.0
    probes: list[str] = field(default_factory=list)


def run(args: argparse.Namespace, session: Session) -> None:
    res = Results()
    worker = session.start_worker() if args.phases & {"throughput", "events"} else None
    res.probes.append(probe_environment("before"))
    if worker is not None:
        run_with_worker(args, worker, res)
        session.stop_worker()
    if "async" in args.phases:
        async_round(args, session.start_worker(WORKFLOWS_STEP_COMMIT="async"), res)
        session.stop_worker()
    N = args.steps
    # CPU time, not wall: waiting on PostgreSQL is in the statement table; this shows what burns CPU.
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    if "breakdown" in args.phases:
        say(f"breakdown: {args.breakdown_runs} runs advanced in this process")
        res.inproc = breakdown(args.breakdown_runs, N, profiler=profiler)
        res.inproc_async = breakdown(args.breakdown_runs, N, synchronous_commit=False)
    if "sweep" in args.phases:
        say(f"sweep: inserting {args.finished:,} finished runs")
        res.fill_seconds = fill_finished_runs(args.finished)
        res.sweeps, res.plans = time_sweeps(args.sweeps)
    res.probes.append(probe_environment("after "))
    report(args, res)
    if profiler is not None and res.inproc is not None:
        print("\ncProfile (CPU time) of the first in-process breakdown: engine functions by cumulative time")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(r"workflows/", 30)
        print("cProfile (CPU time): top 25 by internal time")
        stats.sort_stats("tottime").print_stats(25)


def run_with_worker(args: argparse.Namespace, worker: Worker, res: Results) -> None:
    M, N = args.runs, args.steps
    say("warming up the worker (the first runs and chains also prove it is up)")
    warm = start_runs("bench.noop", {"steps": N}, 4)
    wait_for_runs(warm, worker, timeout=120)
    plain_round(4, N, worker, scratch_key("warm"))
    if "throughput" in args.phases:
        durable_ids: list[Any] = []
        meter = CpuMeter(worker)
        for r in range(args.rounds):
            before = meter.snapshot()
            seconds, ids = durable_round(M, N, worker)
            res.durable_cpu.append(meter.per_unit(before, meter.snapshot(), M * N))
            res.durable_s.append(seconds)
            durable_ids += ids
            say(f"round {r + 1}: durable {M * N / seconds:,.0f} steps/s ({seconds:.2f} s)")
            before = meter.snapshot()
            seconds = plain_round(M, N, worker, scratch_key("done"))
            res.plain_cpu.append(meter.per_unit(before, meter.snapshot(), M * N))
            res.plain_s.append(seconds)
            say(f"round {r + 1}: plain chain {M * N / seconds:,.0f} tasks/s ({seconds:.2f} s)")
        res.overhead = step_overhead(durable_ids)
    if "events" in args.phases:
        say(f"event to resume: {args.waiters} waiting runs, one event every {args.event_interval * 1000:.0f} ms")
        res.single_latencies, res.latencies = event_latencies(args.waiters, args.event_interval, worker)


def async_round(args: argparse.Namespace, worker: Worker, res: Results) -> None:
    """The what-if: one more durable and plain round on a worker whose step-result commits do not
    wait for the WAL flush."""
    M, N = args.runs, args.steps
    warm = start_runs("bench.noop", {"steps": N}, 4)
    wait_for_runs(warm, worker, timeout=120)
    res.async_durable_s, ids = durable_round(M, N, worker)
    res.async_overhead = step_overhead(ids)
    res.async_plain_s = plain_round(M, N, worker, scratch_key("async"))
    say(
        f"async step commits: durable {M * N / res.async_durable_s:,.0f} steps/s, "
        f"plain chain {M * N / res.async_plain_s:,.0f} tasks/s"
    )


def server_line() -> str:
    version, sync_commit, fsync, shared_buffers = server_settings(
        "server_version", "synchronous_commit", "fsync", "shared_buffers"
    )
    return (
        f"Durable engine benchmark  ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, PostgreSQL {version.split()[0]} synchronous_commit={sync_commit} "
        f"fsync={fsync} shared_buffers={shared_buffers})"
    )


def table_rows(args: argparse.Namespace, res: Results) -> list[Row]:
    from workflows.models import WorkflowRun

    M, N = args.runs, args.steps
    rows: list[Row] = []
    if res.durable_s:
        durable, plain = M * N / median(res.durable_s), M * N / median(res.plain_s)
        gaps = res.overhead.gaps if res.overhead else []
        rows += [
            Row("durable steps/s (median round)", f"{durable:,.0f}"),
            Row("plain Celery chain tasks/s (median round)", f"{plain:,.0f}"),
            Row("ratio durable / plain", f"{durable / plain:.2f}x", ">= 2.5x", durable / plain >= 2.5),
            Row("CPU per durable step (all processes)", ms(cpu_total(res.durable_cpu))),
            Row("CPU per plain task (all processes)", ms(cpu_total(res.plain_cpu))),
            Row(
                "CPU-bound ratio (plain CPU / durable CPU)",
                f"{cpu_total(res.plain_cpu) / cpu_total(res.durable_cpu):.2f}x",
                "(>= 2.5x)",
            ),
            Row(
                "per-step overhead p50 (under load)",
                ms(percentile(gaps, 0.5)),
                "<= 1 ms",
                percentile(gaps, 0.5) <= 0.001,
            ),
            Row("per-step overhead p99 (under load)", ms(percentile(gaps, 0.99))),
        ]
    if res.async_durable_s:
        durable, plain = M * N / res.async_durable_s, M * N / res.async_plain_s
        gaps = res.async_overhead.gaps if res.async_overhead else []
        rows += [
            Row("what-if WORKFLOWS_STEP_COMMIT=async: durable steps/s", f"{durable:,.0f}"),
            Row("  plain chain tasks/s, same minute", f"{plain:,.0f}"),
            Row("  ratio durable / plain", f"{durable / plain:.2f}x", "(>= 2.5x)"),
            Row("  per-step overhead p50 (under load)", ms(percentile(gaps, 0.5)), "(<= 1 ms)"),
        ]
    if res.inproc is not None:
        gaps = res.inproc.gaps
        rows += [
            Row(
                "per-step overhead p50 (one run at a time)",
                ms(percentile(gaps, 0.5)),
                "<= 1 ms",
                percentile(gaps, 0.5) <= 0.001,
            ),
            Row("per-step overhead p99 (one run at a time)", ms(percentile(gaps, 0.99))),
        ]
    if res.overhead is not None:
        rows += [
            Row("no-op step body p50", ms(percentile(res.overhead.bodies, 0.5))),
            Row("per-run fixed cost p50 (claim..finish)", ms(percentile(res.overhead.per_run, 0.5))),
        ]
    if res.latencies:
        p50, p99 = percentile(res.latencies, 0.5), percentile(res.latencies, 0.99)
        rate = f"{1 / args.event_interval:g} events/s"
        rows += [
            Row(f"event-to-resume p50 ({rate})", ms(p50), "<= 50 ms", p50 <= 0.050),
            Row(f"event-to-resume p99 ({rate})", ms(p99), "<= 250 ms", p99 <= 0.250),
            Row("event-to-resume p50 (one at a time)", ms(percentile(res.single_latencies, 0.5))),
            Row("event-to-resume p99 (one at a time)", ms(percentile(res.single_latencies, 0.99))),
        ]
    if res.sweeps:
        finished = WorkflowRun.objects.filter(status__in=TERMINAL).count()
        p50, worst = percentile(res.sweeps, 0.5), max(res.sweeps)
        rows += [
            Row(f"sweep p50 ({finished:,} finished runs in the table)", ms(p50), "< 50 ms", p50 < 0.050),
            Row(f"sweep max of {len(res.sweeps)}", ms(worst), "< 50 ms", worst < 0.050),
        ]
    return rows


def cpu_total(rounds: list[dict[str, float]]) -> float:
    """Median over rounds of the CPU seconds per unit, all parts summed."""
    return median([sum(r.values()) for r in rounds])


def print_cpu(res: Results) -> None:
    print("CPU per unit, median of rounds (worker processes + PostgreSQL backends + Redis server + this process):")
    for label, rounds in (("durable step", res.durable_cpu), ("plain task  ", res.plain_cpu)):
        parts = " + ".join(f"{part} {median([r[part] for r in rounds]) * 1000:.3f}" for part in CPU_PARTS)
        print(f"  {label}: {parts} = {cpu_total(rounds) * 1000:.3f} ms")


def report(args: argparse.Namespace, res: Results) -> None:
    M, N = args.runs, args.steps
    print("\n" + server_line())
    print(
        f"shape: {M} runs x {N} no-op steps per round, {args.rounds} rounds alternating durable/plain; one "
        f"celery worker -P prefork -c {args.concurrency}, prefetch 1, acks_late, Redis broker {args.redis}"
    )
    for probe in res.probes:
        print(f"machine {probe}")
    if res.durable_s:
        print(
            "rounds (durable steps/s | plain tasks/s): "
            + ", ".join(f"{M * N / d:,.0f} | {M * N / p:,.0f}" for d, p in zip(res.durable_s, res.plain_s))
        )
        print_cpu(res)
    print_table(table_rows(args, res))
    print_method(args, res)
    if res.inproc is not None and res.inproc_async is not None:
        print_breakdown(res.inproc, "Where the time goes (synchronous_commit=on, as configured):")
        print_breakdown(
            res.inproc_async, "What-if: the same with synchronous_commit=off for this session (WAL flush cost):"
        )


def print_method(args: argparse.Namespace, res: Results) -> None:
    print("\nHow each figure is measured:")
    if res.durable_s:
        gaps = len(res.overhead.gaps) if res.overhead else 0
        print(f"""\
- steps/s: {args.runs} runs, each started in its own commit (its enqueue leaves when it commits); clock from
  before the first start() to the largest finished_at. Plain: {args.runs} chains of {args.steps} immutable no-op
  task signatures sent in a loop; clock to when the last task of the last chain ran. Same worker, broker, queue,
  Celery settings (acks_late, prefetch 1) and log level (WARNING). Redis here has no AOF and no snapshots: the
  plain chain never waits for a disk; the engine commits to PostgreSQL (fsync on).
- CPU per step/task: CPU seconds (/proc utime+stime) used during a round by the worker's process tree, the
  PostgreSQL backends of the bench database, the Redis server (INFO cpu; shared with other users) and this
  process, divided by the steps or tasks. Other load on the machine does not inflate it much, so the
  "CPU-bound ratio" is what the throughput ratio tends to on an otherwise idle 2-core machine with the CPUs
  saturated; the wall-clock ratio is also bounded by latency (two workers each waiting on a commit).
- per-step overhead: started_at(step i) - finished_at(step i-1) within a run, from the step rows ({gaps:,} gaps).
  finished_at is taken right after a body and started_at right before the next body, so the gap is all the
  engine does between two bodies: replay to the next step, then one statement that writes the previous
  result (INSERT .. ON CONFLICT) and checks and extends the lease (UPDATE), one commit. "Under load" = the
  throughput rounds above (two workers and this process starting runs, on two cores); "one run at a time"
  = the in-process breakdown below (worker stopped).
  per-run fixed cost = (run finished_at - started_at) - (first body start .. last body end): the claim,
  loading stored steps, the first lease check and the last result write (not the finish's commit/push).""")
    if res.latencies:
        print(f"""\
- event-to-resume: runs parked in wait_for_event; latency = time.time() returned by the step after the
  wait, as its body starts, minus time.time() just before send_event() in this process. {len(res.latencies)} runs
  get an event every {args.event_interval * 1000:.0f} ms (open loop: if a resume costs the two workers more than
  that, the backlog is in the figure); first, {len(res.single_latencies)} runs get theirs one at a time, each
  after the previous run completed (the resume path alone).""")
    if res.inproc is not None:
        print(f"""\
- breakdown: {res.inproc.runs} runs of {res.inproc.steps} steps created without an enqueue and advanced by
  workflows.engine.advance() in this process, worker stopped, twice (as configured; then with
  synchronous_commit=off on this session). Statements through Django's cursors are timed by a
  connection.execute_wrapper; the engine's prepared statements (claim, per-step checkpoint, finish) go
  through their own psycopg cursor and are counted in "Python" (so is everything else);
  emit_status's hand-off to the publisher thread by wrapping publish_later.
- what-if WORKFLOWS_STEP_COMMIT=async: one more durable round and one plain round with workers whose
  step-result commits do not wait for the WAL flush (a worker crash loses nothing; a PostgreSQL crash may
  lose the last fraction of a second of step results, which then run again). Not the default.""")
    if res.sweeps:
        print(f"""\
- sweep: {args.finished:,} finished runs + 1,000 waiting (not due) runs inserted with INSERT .. SELECT
  generate_series ({res.fill_seconds:.1f} s), then ANALYZE; workflows.sweeper.sweep() timed {len(res.sweeps)}
  times in this process (wall clock around the call; nothing is due). Its queries' plans:""")
        for plan in res.plans:
            print(f"    {plan}")


@dataclass
class Scaling:
    count: int
    durable: list[float] = field(default_factory=list)  # steps/s per round
    plain: list[float] = field(default_factory=list)  # tasks/s per round


def scaling(args: argparse.Namespace, session: Session) -> None:
    """Throughput by worker process count: one worker of ``-c <count>`` at a time, the same shape."""
    M, N = args.runs, args.steps
    probes = [probe_environment("before")]
    results: list[Scaling] = []
    for count in args.workers:
        session.concurrency = count
        worker = session.start_worker()
        say(f"{count} worker process(es): warming up")
        wait_for_runs(start_runs("bench.noop", {"steps": N}, 2 * count), worker, timeout=120)
        found = Scaling(count)
        for r in range(args.rounds):
            seconds, _ = durable_round(M, N, worker)
            found.durable.append(M * N / seconds)
            found.plain.append(M * N / plain_round(M, N, worker, scratch_key("done")))
            say(f"{count} process(es), round {r + 1}: durable {found.durable[-1]:,.0f} steps/s")
        session.stop_worker()
        results.append(found)
    probes.append(probe_environment("after "))
    print("\n" + server_line())
    print(f"shape: {M} runs x {N} no-op steps per round, {args.rounds} rounds per count; medians")
    for probe in probes:
        print(f"machine {probe}")
    first = median(results[0].durable)
    print(f"\n{'worker processes':>16}  {'durable steps/s':>16}  {'vs the first':>12}  {'plain tasks/s':>14}")
    for found in results:
        d = median(found.durable)
        print(f"{found.count:>16}  {d:>16,.0f}  {d / first:>11.2f}x  {median(found.plain):>14,.0f}")
    print(
        f"\nEvery count shares this machine's {os.cpu_count()} cores with PostgreSQL, Redis and this "
        "process (which starts the runs): past the cores, more processes add waiting, not work."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Always 0 once the figures are printed, whether they meet their targets or not."""
    args = parse_args(argv)
    with bench_session(args) as session:
        if args.workers:
            scaling(args, session)
        else:
            run(args, session)
    return 0


if __name__ == "__main__":
    run_main(main)
