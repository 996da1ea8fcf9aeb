#!/usr/bin/env python
"""Benchmark of approvals (decision to resume) and ledger reconciliation (not a test: it prints).

    .venv/bin/python bench/approvals.py [--waiters K] [--operations N] [--stored S] ...

Self-contained like bench/engine.py (through bench/harness.py): its own PostgreSQL database (dropped
at the end), Redis db 11, a private Celery queue with one ``celery worker -P prefork -c 2``, and its
own sandbox payment provider process (examples/sandbox) on a free port with a temporary data file.

1. decision-to-resume: runs of ``bench.approval`` park in ``wait_for_approval`` (group
   "bench-approvers"), then run one step returning time.time(). Each gets an approval, through
   ``approvals.public.decide()`` (the service) or ``POST /api/approvals/<id>/decision`` (Django's
   test Client: the whole Django/DRF request path, token auth, no socket); time.time() is noted
   just before. Latency = that step's start - the decision's time. One at a time, then at a steady
   rate (open loop), for each path.
2. reconcile: N ExternalOperation rows in status unknown (bulk insert), S of them with a refund
   stored at the sandbox beforehand (POSTed concurrently), the rest never sent; an HttpAdapter for
   the sandbox; ``operations_reconcile`` (what ``manage.py reconcile`` runs: batches of 200 looked
   up concurrently, 200 keys a request, and recorded one transaction a batch) timed.
   Duplicate external effects: refunds at the sandbox beyond those stored beforehand (must be 0).

The figures, their targets and PASS/MISS are printed as a table. It exits 0 once printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # as in bench/engine.py: bench/ would shadow workflows

from bench.harness import (  # noqa: E402
    CREATED,
    Row,
    Statements,
    add_session_arguments,
    bench_session,
    check_running,
    ms,
    parse_phases,
    percentile,
    print_table,
    probe_environment,
    run_main,
    say,
    server_settings,
    timed_statements,
    wait_for_runs,
    wait_until,
)
from tests.support import Worker  # noqa: E402

SYSTEM = "bench-sandbox"
SAMPLE_SYSTEM = "bench-sandbox-shipped"  # the operations reconciled (through the adapter as shipped)
APPROVERS = "bench-approvers"  # the same as bench.workflows.APPROVERS (not imported before django.setup())


# --- arguments -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--waiters", "-K", type=int, default=100, help="runs per steady-rate latency series, per path (default 100)"
    )
    p.add_argument("--single", type=int, default=25, help="runs per one-at-a-time series, per path (default 25)")
    p.add_argument(
        "--decision-interval",
        type=float,
        default=0.05,
        help="seconds between two decisions in the steady series (default 0.05: 20/s)",
    )
    p.add_argument("--operations", "-N", type=int, default=10_000, help="unknown operations (default 10,000)")
    p.add_argument("--stored", type=int, default=None, help="of which stored at the sandbox beforehand (default half)")
    p.add_argument("--post-threads", type=int, default=8, help="threads POSTing the stored refunds (default 8)")
    p.add_argument(
        "--phases", default="latency,reconcile", help="comma-separated subset of latency,reconcile (default both)"
    )
    add_session_arguments(p, database="durable_bench_appr", redis="redis://127.0.0.1:6379/11")
    args = p.parse_args(argv)
    args.phases = parse_phases(p, args.phases, {"latency", "reconcile"})
    if args.stored is None:
        args.stored = args.operations // 2
    if not 0 <= args.stored <= args.operations:
        p.error("--stored must be between 0 and --operations")
    return args


# --- 1. decision to resume -----------------------------------------------------------------------
@dataclass
class Series:
    path: str  # "decide()" or "HTTP API"
    mode: str  # "one at a time" or "20/s"
    latencies: list[float] = field(default_factory=list)
    call: list[float] = field(default_factory=list)  # how long the decision call itself took


def approver() -> tuple[Any, str]:
    """A user in the bench-approvers group, and an API token of theirs."""
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    user = User.objects.create_user("bench-approver", password="x")
    user.groups.add(Group.objects.get_or_create(name=APPROVERS)[0])
    return user, Token.objects.create(user=user).key


def start_waiting(count: int, worker: Worker) -> list[tuple[Any, int]]:
    """``count`` runs parked in wait_for_approval: (run id, approval request id), in start order."""
    from approvals.models import ApprovalRequest
    from workflows import public as wf

    ids = [wf.start("bench.approval", {"n": i}).id for i in range(count)]
    CREATED.extend(ids)
    wait_for_runs(ids, worker, status="waiting", timeout=180)
    requests = dict(ApprovalRequest.objects.filter(run_id__in=ids).values_list("run_id", "id"))
    return [(run_id, requests[run_id]) for run_id in ids]


def decision_latencies(args: argparse.Namespace, worker: Worker) -> list[Series]:
    from django.test import Client

    from approvals.public import decide
    from workflows.models import WorkflowRun

    user, token = approver()
    client = Client(SERVER_NAME="localhost", headers={"Authorization": f"Token {token}"})

    def by_service(request_id: int) -> None:
        decided = decide(request_id, by=user, approve=True, version="1")
        if not decided.created:
            raise RuntimeError(f"request {request_id} had been decided already")

    def by_api(request_id: int) -> None:
        response = client.post(
            f"/api/approvals/{request_id}/decision", {"approve": True, "version": "1"}, content_type="application/json"
        )
        if response.status_code != 200:
            raise RuntimeError(f"decision on {request_id}: HTTP {response.status_code} {response.content[:300]!r}")

    paths: list[tuple[str, Callable[[int], None]]] = [("decide()", by_service), ("HTTP API", by_api)]
    # A few decisions first: warms both paths (imports, prepared statements, the worker's processes).
    for _, send in paths:
        warm = start_waiting(3, worker)
        for _, request_id in warm:
            send(request_id)
        wait_for_runs([run_id for run_id, _ in warm], worker, timeout=60)
    rate = f"{1 / args.decision_interval:g}/s"
    out: list[Series] = []
    for label, send in paths:
        parked = start_waiting(args.single + args.waiters, worker)
        single = Series(label, "one at a time")
        steady = Series(label, rate)
        sent: dict[Any, float] = {}
        say(f"{label}: {args.single} decisions one at a time")
        for run_id, request_id in parked[: args.single]:
            sent[run_id] = time.time()
            send(request_id)
            single.call.append(time.time() - sent[run_id])
            done = WorkflowRun.objects.filter(pk=run_id, status="completed")
            wait_until(done.exists, timeout=60, what=f"run {run_id} to resume", check=partial(check_running, worker))
        say(f"{label}: {args.waiters} decisions at {rate}")
        next_at = time.monotonic()
        for run_id, request_id in parked[args.single :]:
            sent[run_id] = time.time()
            send(request_id)
            steady.call.append(time.time() - sent[run_id])
            next_at += args.decision_interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        ids = [run_id for run_id, _ in parked]
        wait_for_runs(ids, worker, timeout=180)
        results: dict[Any, Any] = dict(WorkflowRun.objects.filter(id__in=ids).values_list("id", "result"))
        single.latencies = [results[r] - sent[r] for r, _ in parked[: args.single]]
        steady.latencies = [results[r] - sent[r] for r, _ in parked[args.single :]]
        out += [single, steady]
    return out


# --- 2. reconcile --------------------------------------------------------------------------------
class TimedAdapter:
    """An HttpAdapter for the sandbox (by default the project's, as shipped: a fresh httpx.Client
    per call), with the wall time of each lookup added up (thread-safe)."""

    def __init__(self, base_url: str) -> None:
        from ledger import HttpAdapter

        self.inner = HttpAdapter(
            base_url=base_url,
            submit_path="/v1/refunds",
            lookup_path="/v1/refunds?key={key}",
            batch_lookup_path="/v1/refunds/lookup",
        )
        self.can_lookup = True
        self.lookups = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def submit(self, op: Any) -> Any:
        raise RuntimeError("reconciliation must never submit")  # a duplicate effect in the making

    def lookup(self, op: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.lookup(op)
        finally:
            elapsed = time.perf_counter() - t0
            with self._lock:
                self.lookups += 1
                self.seconds += elapsed

    def lookup_many(self, ops: list[Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.lookup_many(ops)
        finally:
            elapsed = time.perf_counter() - t0
            with self._lock:
                self.lookups += len(ops)
                self.seconds += elapsed

    def reset(self) -> None:
        self.lookups, self.seconds = 0, 0.0


def refund_request(i: int) -> dict[str, Any]:
    return {"order": f"B{i}", "amount": f"{1 + i % 500}.00", "currency": "GBP"}


def stored_indices(total: int, stored: int) -> list[int]:
    """Which operations have a refund at the sandbox: spread evenly (every other one for half), so
    any prefix, such as the sample, holds the same mix."""
    return [i for i in range(total) if (i * stored) % total < stored]


def store_refunds(base_url: str, indices: list[int], threads: int) -> float:
    """POST the refunds of ``indices`` (keys bench-<i>) to the sandbox; returns seconds. Setup only:
    through the TCP_NODELAY sandbox on kept-alive connections, so it takes seconds, not minutes."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=30, limits=httpx.Limits(max_connections=threads)) as client:

        def post(i: int) -> None:
            response = client.post("/v1/refunds", json=refund_request(i), headers={"Idempotency-Key": key(i)})
            if response.status_code != 201:
                raise RuntimeError(f"storing refund {i}: HTTP {response.status_code} {response.text[:300]}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(post, indices))
        return time.perf_counter() - t0


def key(i: int) -> str:
    return f"bench-{i}"


def insert_unknown(count: int, sample: int) -> None:
    """``count`` unknown operations, keys bench-0..; the first ``sample`` under SAMPLE_SYSTEM."""
    from django.utils import timezone

    from ledger.models import ExternalOperation
    from ledger.services.operations import request_fingerprint

    now = timezone.now()
    rows = []
    for i in range(count):
        request = refund_request(i)
        system = SAMPLE_SYSTEM if i < sample else SYSTEM
        rows.append(
            ExternalOperation(
                key=key(i),
                system=system,
                action="refund",
                request=request,
                request_hash=request_fingerprint(system=system, action="refund", request=request),
                status="unknown",
                note="bench: the answer was lost",
                submit_count=1,
                submitted_at=now,
            )
        )
    ExternalOperation.objects.bulk_create(rows, batch_size=2000)


@dataclass
class Reconcile:
    label: str
    seconds: float
    operations: int
    verdicts: Counter[str]
    statuses: Counter[str]
    lookup_seconds: float
    sql: Statements = field(default_factory=dict)  # (sequential only)

    @property
    def rate(self) -> float:
        return self.operations / self.seconds


def statuses(system: str = SYSTEM) -> Counter[str]:
    from django.db.models import Count

    from ledger.models import ExternalOperation

    rows = ExternalOperation.objects.filter(system=system).values("status").annotate(n=Count("pk")).order_by()
    return Counter({row["status"]: row["n"] for row in rows})


def reconcile_sequential(adapter: TimedAdapter, system: str, label: str) -> Reconcile:
    """``operations_reconcile``, as ``manage.py reconcile --system bench-sandbox`` runs it, with its
    SQL statements timed (a connection.execute_wrapper; its cost is in the figure, ~µs each)."""
    from ledger.services import operations_reconcile

    sql: Statements = {}
    adapter.reset()
    with timed_statements(sql):
        t0 = time.perf_counter()
        results = operations_reconcile(system=system)
        seconds = time.perf_counter() - t0
    return Reconcile(
        label, seconds, len(results), Counter(r.verdict for r in results), statuses(system), adapter.seconds, sql
    )


def lookup_probe(adapter: TimedAdapter, system: str, count: int = 200) -> tuple[float, float]:
    """p50 of one lookup through the shipped HttpAdapter (fresh connection) and of the same GET on a
    kept-alive httpx.Client: what the per-call connection costs."""
    import httpx

    from ledger.models import ExternalOperation

    ops = list(ExternalOperation.objects.filter(system=system).order_by("pk")[:count])
    fresh, kept = [], []
    for op in ops:
        t0 = time.perf_counter()
        adapter.inner.lookup(op)
        fresh.append(time.perf_counter() - t0)
    with httpx.Client(timeout=5) as client:
        for op in ops:
            t0 = time.perf_counter()
            client.get(adapter.inner.url("/v1/refunds?key={key}", op))
            kept.append(time.perf_counter() - t0)
    return percentile(fresh, 0.5), percentile(kept, 0.5)


@dataclass
class ReconcilePart:
    stored: int
    store_seconds: float
    refunds_before: int
    runs: list[Reconcile] = field(default_factory=list)
    refunds_after: int = 0
    created_after: int = 0
    created_before: int = 0
    lookup_fresh: float = 0.0
    lookup_kept: float = 0.0


def reconcile_part(args: argparse.Namespace, data_dir: Path) -> ReconcilePart:
    from examples.sandbox.process import SandboxProcess
    from ledger import register_adapter, unregister_adapter

    sandbox = SandboxProcess(data_dir / "sandbox.sqlite3", log=data_dir / "sandbox.log")
    sandbox.start()
    try:
        say(f"sandbox on {sandbox.url}; storing {args.stored:,} refunds ({args.post_threads} threads)")
        store_seconds = store_refunds(sandbox.url, stored_indices(args.operations, args.stored), args.post_threads)
        before = sandbox.stats()
        part = ReconcilePart(
            args.stored, store_seconds, before["refunds"], created_before=before["requests"].get("created", 0)
        )
        say(f"stored in {store_seconds:.1f} s; inserting {args.operations:,} unknown operations")
        insert_unknown(args.operations, args.operations)  # all of them through the adapter as shipped
        shipped = TimedAdapter(sandbox.url)
        register_adapter(SAMPLE_SYSTEM, shipped)
        try:
            say(f"reconciling all {args.operations:,} as manage.py reconcile does (adapter and sandbox as shipped)")
            part.runs.append(
                reconcile_sequential(shipped, SAMPLE_SYSTEM, f"shipped: manage.py reconcile, all {args.operations:,}")
            )
            say(f"  {part.runs[-1].rate:,.0f} operations/s")
            part.lookup_fresh, part.lookup_kept = lookup_probe(shipped, SAMPLE_SYSTEM)
        finally:
            unregister_adapter(SAMPLE_SYSTEM)
        after = sandbox.stats()
        part.refunds_after = after["refunds"]
        part.created_after = after["requests"].get("created", 0)
        return part
    finally:
        sandbox.stop()


# --- output --------------------------------------------------------------------------------------
def report(args: argparse.Namespace, probes: list[str], series: list[Series], rec: ReconcilePart | None) -> None:
    version, sync_commit = server_settings("server_version", "synchronous_commit")
    print(
        f"\nApprovals and reconciliation benchmark  ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"PostgreSQL {version.split()[0]} synchronous_commit={sync_commit}; one celery worker -P prefork "
        f"-c {args.concurrency}, Redis {args.redis})"
    )
    for probe in probes:
        print(f"machine {probe}")
    rows: list[Row] = []
    for s in series:
        p50, p99 = percentile(s.latencies, 0.5), percentile(s.latencies, 0.99)
        targeted = s.mode != "one at a time"
        rows += [
            Row(
                f"decision-to-resume p50, {s.path} ({s.mode})",
                ms(p50),
                "<= 100 ms" if targeted else "(<= 100 ms)",
                p50 <= 0.100 if targeted else None,
            ),
            Row(
                f"decision-to-resume p99, {s.path} ({s.mode})",
                ms(p99),
                "<= 500 ms" if targeted else "(<= 500 ms)",
                p99 <= 0.500 if targeted else None,
            ),
        ]
        if targeted:
            rows.append(
                Row(
                    f"  the decision call itself p50 / p99 ({s.path})",
                    f"{ms(percentile(s.call, 0.5))} / {ms(percentile(s.call, 0.99))}",
                )
            )
    if rec is not None:
        duplicates = rec.refunds_after - rec.refunds_before
        for i, r in enumerate(rec.runs):
            rows.append(
                Row(
                    f"reconcile ops/s, {r.label}"[:48],
                    f"{r.rate:,.0f}",
                    ">= 500" if i == 0 else "(>= 500)",
                    r.rate >= 500 if i == 0 else None,
                )
            )
        rows.append(Row("duplicate effects (new refunds at the sandbox)", str(duplicates), "0", duplicates == 0))
    print_table(rows)
    if series:
        print(f"""
How: {len(series) // 2} paths x ({args.single} one at a time + {args.waiters} at {1 / args.decision_interval:g}/s)
runs of bench.approval, each parked in wait_for_approval (3 durable steps: request (atomic), wait_for_event
"approval:<id>"), then step "resumed" returning time.time() as its body starts. Latency = that - time.time()
just before the decision. decide(): approvals.public.decide() in this process (lock run + request, save,
run_send_event, decision log, commit; the Celery enqueue leaves on commit). HTTP API: POST
/api/approvals/<id>/decision through django.test.Client (URL routing, middleware, DRF token auth, the
visibility query, the same service, the response's serializer); no socket, no web server. "One at a time":
the next decision only once the previous run completed. Steady: open loop, backlog included.""")
    if rec is not None:
        print(f"""
Reconcile: {args.operations:,} ExternalOperation rows bulk-inserted as unknown; {rec.stored:,} keys (every other one)
POSTed to the sandbox first ({rec.store_seconds:.1f} s, {args.post_threads} threads), the rest never sent. Then
ledger.services.operations_reconcile, what manage.py reconcile calls, over all of them: lookups concurrently
(LEDGER_RECONCILE_CONCURRENCY threads, kept-alive clients), findings recorded 200 per transaction. The adapter is
ledger.HttpAdapter(base_url=<sandbox>, lookup_path="/v1/refunds?key={{key}}") as shipped, wrapped to time lookups
("summed over threads": they overlap) and to refuse any submit. Sandbox refunds: {rec.refunds_before:,} before,
{rec.refunds_after:,} after; "created" answers {rec.created_before:,} before, {rec.created_after:,} after.""")
        for r in rec.runs:
            per = r.seconds / max(r.operations, 1)
            print(
                f"- {r.label}: {r.operations:,} operations in {r.seconds:.1f} s = {per * 1000:.2f} ms each; "
                f"verdicts {dict(r.verdicts)}; rows now {dict(r.statuses)}; lookups {r.lookup_seconds:.1f} s "
                f"in total ({r.lookup_seconds * 1000 / max(r.operations, 1):.2f} ms each, summed over threads)"
            )
            total = r.operations
            if r.sql and total:
                statements = sum(int(v[0]) for v in r.sql.values())
                sql_seconds = sum(v[1] for v in r.sql.values())
                other = r.seconds - sql_seconds - r.lookup_seconds
                print(f"  where the time goes, per operation ({statements / total:.1f} SQL statements):")
                print(
                    f"    {'HTTP lookups (summed over the concurrent threads)':<60} "
                    f"{r.lookup_seconds * 1000 / total:>7.3f} ms"
                )
                for label, (count, sec) in sorted(r.sql.items(), key=lambda kv: -kv[1][1])[:8]:
                    print(f"    {('SQL ' + label)[:52]:<52} x{count / total:<5.1f} {sec * 1000 / total:>7.3f} ms")
                print(
                    f"    {'COMMIT, Python (ORM, FSM, redaction, logging), the rest':<60} "
                    f"{other * 1000 / total:>7.3f} ms"
                )
        print(
            f"one lookup p50 (200 keys, sequential): the adapter {ms(rec.lookup_fresh)} "
            f"(a plain kept-alive httpx.Client on the same sandbox: {ms(rec.lookup_kept)})"
        )


# --- main ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    series: list[Series] = []
    rec: ReconcilePart | None = None
    with bench_session(args) as session:
        probes = [probe_environment("before")]
        if "latency" in args.phases:
            series = decision_latencies(args, session.start_worker())
            session.stop_worker()
        if "reconcile" in args.phases:
            with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as data_dir:
                rec = reconcile_part(args, Path(data_dir))
        probes.append(probe_environment("after "))
        report(args, probes, series, rec)
    return 0


if __name__ == "__main__":
    run_main(main)
