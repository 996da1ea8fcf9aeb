#!/usr/bin/env python
"""Benchmark of inbound work: signed webhooks, submissions, and a provider's outcome waking a run
(not a test: it prints).

    .venv/bin/python bench/inbound.py [--deliveries N] [--submissions N] [--outcomes N] [--clients C]
                                      [--rate R] [--paced-seconds S] [--timeline FILE]

Self-contained like bench/chat.py (through bench/harness.py): its own PostgreSQL database (dropped at
the end), Redis db 13, a private queue with one ``celery worker -P prefork -c 2``, and --web real
daphne processes (default 2, one per core, as a deployment would run them) serving the project with
two webhook sources of its own (WEBHOOK_SOURCES_JSON). The clients are C kept-alive HTTP/1.1
connections of this process (``Connection``: a lean client, so that the load costs the servers'
two cores little), on one asyncio loop, spread evenly over the daphnes, with this process's garbage
collector off while they send (``no_collector_pauses``: a pause of the client's is otherwise timed
as the servers').

0. floor: N ``GET /healthz`` from the same clients: daphne, Django's handler and middleware and a
   view that does nothing. What the machine's HTTP stack can answer at all, the baseline for 1 and 2
   (printed as their ratio to it).
1. webhooks: N signed deliveries (Standard Webhooks) to a source whose action starts a one-step
   ``bench.noop`` run keyed by the event id; 10% of them are replays of an earlier event (the same id
   and body, signed again), sent while the original may still be in flight. Two parts: N from C
   clients each sending when answered (closed loop: the most the servers answer a second, at a
   latency that is queueing by construction), then --rate a second for --paced-seconds, each sent
   when due whatever the answers before it (open loop, as independent senders do), its latency
   counted from when it was due: the latency at that rate. Then, once the worker has run
   everything: runs started per event (duplicate effects: more than one; lost: an accepted event
   without a completed run).
1b. webhooks-later: the same burst to a source with ``"act": "later"``: each delivery is committed
   pending before its 202, and the worker starts its run afterwards (README "Acting now or later").
2. submissions: N ``POST /api/agents/bench.chat/<name>/submissions`` with an ``Idempotency-Key``
   (token auth), spread over 20 agents, 10% replays of an earlier key and body: each committed
   pending before its 202, and its turn queued by the worker. The same figures; effects are
   submissions and turns per key, and every submission completed.
3. outcome: K runs of ``bench.outcome`` one after another, each waiting (``ledger.wait_for_outcome``)
   for an ``unknown`` ledger operation of its own; the provider's signed ``refund.succeeded`` webhook
   for it settles the operation (``operation_report``), which wakes the run. Time from sending the
   webhook to the run's next step body starting (its result is ``time.time()`` then).

The figures, their targets and PASS/MISS are printed as a table. It exits 0 once printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # as in bench/engine.py: bench/ would shadow workflows

import httpx  # noqa: E402

from bench.harness import (  # noqa: E402
    CpuMeter,
    Row,
    Session,
    add_session_arguments,
    bench_session,
    ms,
    no_collector_pauses,
    parse_phases,
    percentile,
    print_table,
    probe_environment,
    run_main,
    say,
    wait_until,
)
from tests.support import AsgiServer, Worker  # noqa: E402

PHASES = {"floor", "webhooks", "webhooks-later", "submissions", "outcome"}
SECRET = "whsec_" + "YmVuY2gtaW5ib3VuZC1zZWNyZXQ="  # base64 of "bench-inbound-secret"
KIND = "bench.chat"  # bench.chat_agents.KIND (not imported before django.setup())
AGENTS = 20
SOURCES = {
    "bench-runs": {
        "scheme": "standard",
        "secrets": [SECRET],
        "action": {"type": "workflow", "workflow": "bench.noop", "payload_from": "data"},
    },
    "bench-runs-later": {
        "scheme": "standard",
        "secrets": [SECRET],
        "act": "later",
        "action": {"type": "workflow", "workflow": "bench.noop", "payload_from": "data"},
    },
    "bench-payments": {
        "scheme": "standard",
        "secrets": [SECRET],
        "action": {"type": "operation_outcome", "system": "bench-payments"},
    },
}


# --- arguments -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--deliveries", type=int, default=3000, help="webhook deliveries, replays included (default 3000)")
    p.add_argument("--submissions", type=int, default=1500, help="submission requests, replays included (default 1500)")
    p.add_argument("--outcomes", type=int, default=50, help="outcome webhooks waking a waiting run (default 50)")
    p.add_argument("--clients", "-C", type=int, default=16, help="requests in flight at once (default 16)")
    p.add_argument("--web", type=int, default=2, help="daphne processes, the clients spread over them (default 2)")
    p.add_argument(
        "--rate",
        type=float,
        default=500,
        help="the paced part of each burst offers this many requests a second (default 500, the target)",
    )
    p.add_argument("--paced-seconds", type=float, default=8, help="how long the paced part lasts (default 8)")
    p.add_argument(
        "--timeline",
        type=Path,
        help="write each paced request's phase, due time (s), latency from due (ms) and status to this\n"
        "file, one per line in the order answered: where a tail comes from (a stall or a queue)",
    )
    p.add_argument("--replays", type=float, default=0.10, help="share of requests that replay an earlier one (0.10)")
    p.add_argument(
        "--worker",
        choices=("after", "during"),
        default="after",
        help="when the worker runs the work a burst starts: after it (default: the burst measures the accept\n"
        "path, as with workers on machines of their own), or during it, on the same two cores",
    )
    p.add_argument(
        "--phases",
        default=",".join(sorted(PHASES)),
        help="comma-separated subset of floor,outcome,submissions,webhooks,webhooks-later (default all)",
    )
    add_session_arguments(p, database="durable_bench_inbound", redis="redis://127.0.0.1:6379/13")
    args = p.parse_args(argv)
    args.phases = parse_phases(p, args.phases, PHASES)
    if min(args.deliveries, args.submissions, args.outcomes, args.clients, args.web) < 1:
        p.error("--deliveries, --submissions, --outcomes, --clients and --web must be at least 1")
    if args.rate <= 0 or args.paced_seconds <= 0:
        p.error("--rate and --paced-seconds must be positive")
    if not 0 <= args.replays < 1:
        p.error("--replays is a share from 0 up to 1")
    return args


def configure_inbound_environment() -> None:
    """Before Django reads its settings; the worker and daphne processes inherit it."""
    os.environ.update(
        {
            "AGENTS_MODULES": "bench.chat_agents",
            "WEBHOOK_SOURCES_JSON": json.dumps(SOURCES),
            # The bench queues far more than a customer could: the caps would answer 429s.
            "AGENTS_MAX_PENDING_SUBMISSIONS": "100000",
            "AGENTS_MAX_OPEN_TURNS_PER_USER": "0",
            "AGENTS_MAX_QUEUED_TURNS": "0",
        }
    )


# --- the requests --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """One request to send: ``prepare()`` gives its headers when it is sent (a signature's
    timestamp is that moment's); ``original`` is the index of the request it replays, or None."""

    path: str
    body: bytes
    prepare: Callable[[], dict[str, str]]
    original: int | None = None
    method: str = "POST"


@dataclass
class Sent:
    statuses: list[int] = field(default_factory=list)
    refusals: dict[int, str] = field(default_factory=dict)  # a status other than 200/202 -> one body
    latencies: list[float] = field(default_factory=list)
    dues: list[float] = field(default_factory=list)  # paced: when each answered request was due, s from the start
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds a request, by part (CpuMeter)

    @property
    def rate(self) -> float:
        return len(self.statuses) / self.seconds if self.seconds else 0.0

    def count(self, *codes: int) -> int:
        return sum(1 for s in self.statuses if s in codes)


def with_replays(firsts: list[Request], share: float, rng: random.Random) -> list[Request]:
    """The requests in order, each replay put after its original at a random distance (often
    close enough to be in flight together)."""
    order: list[Request] = list(firsts)
    replays = round(len(firsts) * share / (1 - share))
    for _ in range(replays):
        i = rng.randrange(len(firsts))
        original = firsts[i]
        at = min(len(order), order.index(original) + 1 + rng.randrange(64))
        order.insert(at, Request(original.path, original.body, original.prepare, original=i))
    return order


class Connection:
    """One kept-alive HTTP/1.1 connection: a request, then its answer, then the next.

    The load comes from this process, on the same two cores as the servers it measures, so its
    client must cost little: httpx's AsyncClient spent about 3 ms of CPU a request here (a core at
    300 requests a second, taken from the servers), this about 0.2 ms. It speaks only what daphne
    answers: a status line, headers, then a Content-Length body or a chunked one."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        status_line, *lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        pairs = (line.partition(":") for line in lines if line)
        fields = {name.strip().lower(): value.strip() for name, _, value in pairs}
        if "content-length" in fields:
            content = await self.reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            content = b""
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                content += (await self.reader.readexactly(size + 2))[:-2]
            await self.reader.readuntil(b"\r\n")  # the empty trailer
        else:
            raise RuntimeError(f"an answer without a length: {status_line}")
        if fields.get("connection", "").lower() == "close":
            await self.close()
        return int(status_line.split()[1]), content

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def send_all(servers: list[AsgiServer], requests: list[Request], clients: int) -> Sent:
    """Send ``requests`` from ``clients`` kept-alive connections at once, spread evenly over the
    servers, each sending its next request when the answer to its last has come."""
    sent = Sent()
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)

    async def one_client(connection: Connection) -> None:
        try:
            while not queue.empty():
                r = queue.get_nowait()
                t0 = time.perf_counter()
                status, content = await connection.send(r.method, r.path, r.body, r.prepare())
                sent.latencies.append(time.perf_counter() - t0)
                sent.statuses.append(status)
                if status not in OK:
                    sent.refusals.setdefault(status, content[:300].decode(errors="replace"))
        finally:
            await connection.close()

    with no_collector_pauses():
        t0 = time.perf_counter()
        await asyncio.gather(*(one_client(Connection(servers[i % len(servers)].url)) for i in range(clients)))
        sent.seconds = time.perf_counter() - t0
    return sent


PACED_CONNECTIONS = 64


async def send_paced(servers: list[AsgiServer], requests: list[Request], rate: float) -> Sent:
    """Send ``requests`` at ``rate`` a second, each when it is due whatever the answers before it
    (open loop, as independent senders do), on up to PACED_CONNECTIONS kept-alive connections
    spread over the servers. A request's latency counts from when it was due, so a server that
    falls behind shows in it, and in the rate it answered at, not only in a client that waits."""
    sent = Sent()
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    connections = [Connection(servers[i % len(servers)].url) for i in range(PACED_CONNECTIONS)]
    for connection in connections:
        idle.put_nowait(connection)

    async def one(r: Request, due: float) -> None:
        connection = await idle.get()
        try:
            status, content = await connection.send(r.method, r.path, r.body, r.prepare())
        finally:
            idle.put_nowait(connection)
        sent.latencies.append(time.perf_counter() - due)
        sent.dues.append(due - start)
        sent.statuses.append(status)
        if status not in OK:
            sent.refusals.setdefault(status, content[:300].decode(errors="replace"))

    with no_collector_pauses():
        start = time.perf_counter() + 0.05
        tasks = []
        for i, r in enumerate(requests):
            due = start + i / rate
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(r, due)))
        try:
            await asyncio.gather(*tasks)
        finally:
            for connection in connections:
                await connection.close()
    sent.seconds = time.perf_counter() - start
    return sent


OK = (200, 202)  # accepted, or a duplicate answered as the first was


def metered(servers: list[AsgiServer], send: Callable[[], Sent], worker: Worker | None = None) -> Sent:
    """``send()``, with the CPU each of its requests cost the servers, PostgreSQL, Redis, this
    client and a running worker: what a request costs whatever else the machine does meanwhile
    (this machine's speed swings by the hour; the costs swing much less)."""
    meter = CpuMeter(worker, servers)
    before = meter.snapshot()
    sent = send()
    sent.cpu = meter.per_unit(before, meter.snapshot(), len(sent.statuses))
    return sent


def signed(event_id: str, body: bytes) -> Callable[[], dict[str, str]]:
    from webhooks.verify import sign_standard

    def headers() -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            **sign_standard(secret=SECRET, event_id=event_id, timestamp=int(time.time()), body=body),
        }

    return headers


def burst(
    sent: Sent, paced: Sent, *, unique: int, done_keys: list[str], drained: float, more_effects: int = 0
) -> Burst:
    """What a burst did: its answers, and from the keys of the work that was done (one per effect),
    the effects done twice (``more_effects`` added) and the events or keys never done."""
    return Burst(
        sent=sent,
        paced=paced,
        unique=unique,
        accepted=sent.count(202) + paced.count(202),
        duplicates=sent.count(200) + paced.count(200),
        refused=len(sent.statuses) + len(paced.statuses) - sent.count(200, 202) - paced.count(200, 202),
        effects_twice=len(done_keys) - len(set(done_keys)) + more_effects,
        lost=unique - len(set(done_keys)),
        drain_seconds=drained,
    )


# --- 0. floor ---------------------------------------------------------------------------------------
def floor(args: argparse.Namespace, servers: list[AsgiServer]) -> tuple[Sent, Sent]:
    """The same clients and number of requests, to ``GET /healthz``: the whole HTTP stack (daphne,
    Django's handler and middleware, a view) doing no work. No endpoint of the project can answer
    faster on this machine: the baseline the bursts are compared with. Then the same paced part as
    a burst's: the latency this machine gives a request that does nothing, at --rate."""
    requests = [Request("/healthz", b"", dict, method="GET") for _ in range(args.deliveries)]
    say(f"floor: {len(requests):,} GET /healthz, {args.clients} at once")
    sent = metered(servers, lambda: asyncio.run(send_all(servers, requests, args.clients)))
    paced = [Request("/healthz", b"", dict, method="GET") for _ in range(paced_count(args))]
    say(f"  then {len(paced):,} at {args.rate:,.0f} a second")
    paced_sent = asyncio.run(send_paced(servers, paced, args.rate))
    if sent.refusals or paced_sent.refusals:
        raise RuntimeError(f"/healthz answered {sent.refusals or paced_sent.refusals}")
    return sent, paced_sent


# --- 1. webhooks -----------------------------------------------------------------------------------
@dataclass
class Burst:
    sent: Sent  # closed loop: --clients in flight, each sending when answered
    paced: Sent  # open loop, at --rate
    unique: int
    accepted: int  # 202 answers
    duplicates: int  # 200 answers
    refused: int  # anything else
    effects_twice: int  # events with more than one effect
    lost: int  # accepted events without a completed effect
    drain_seconds: float


def sent_with_worker(
    args: argparse.Namespace,
    session: Session,
    servers: list[AsgiServer],
    requests: list[Request],
    paced: list[Request],
) -> tuple[Sent, Sent]:
    """Send a burst: ``requests`` from --clients connections, then ``paced`` at --rate. With
    ``--worker after`` the worker is stopped while they are sent and started again for the drain
    (the work waits in the queue meanwhile: it is handed over, not yet done)."""
    if args.worker == "after":
        session.stop_worker()
    try:
        closed = metered(servers, lambda: asyncio.run(send_all(servers, requests, args.clients)), session.worker)
        say(f"  then {len(paced):,} at {args.rate:,.0f} a second")
        return closed, asyncio.run(send_paced(servers, paced, args.rate))
    finally:
        if session.worker is None:
            session.start_worker()


def paced_count(args: argparse.Namespace) -> int:
    """Requests in the paced part of a burst, replays included."""
    return max(1, int(args.rate * args.paced_seconds + 0.5))


def webhooks(
    args: argparse.Namespace,
    session: Session,
    servers: list[AsgiServer],
    check: Callable[[], None],
    source: str = "bench-runs",
) -> Burst:
    from webhooks.models import WebhookDelivery
    from workflows.models import WorkflowRun

    rng = random.Random(1)

    def deliveries(prefix: str, count: int) -> list[Request]:
        return [
            Request(f"/webhooks/{source}/", body, signed(f"{prefix}_{i}", body))
            for i in range(round(count * (1 - args.replays)))
            for body in [json.dumps({"type": "order.paid", "data": {"steps": 1, "n": i}}).encode()]
        ]

    firsts, paced_firsts = deliveries("evt", args.deliveries), deliveries("paced", paced_count(args))
    requests = with_replays(firsts, args.replays, rng)
    paced = with_replays(paced_firsts, args.replays, rng)
    replays = len(requests) - len(firsts)
    say(f"webhooks to {source}: {len(requests):,} deliveries ({replays:,} replays), {args.clients} at once")
    sent, paced_sent = sent_with_worker(args, session, servers, requests, paced)
    t0 = time.monotonic()
    runs = WorkflowRun.objects.filter(workflow="bench.noop", idempotency_key__startswith=f"{source}:")
    to_act = WebhookDelivery.objects.filter(source=source, action_state="pending")
    wait_until(
        lambda: not to_act.exists() and not runs.exclude(status__in=("completed", "failed", "terminated")).exists(),
        timeout=600,
        what="the started runs to finish",
        check=check,
        interval=0.2,
    )
    keys = list(runs.filter(status="completed").values_list("idempotency_key", flat=True))
    unique = len(firsts) + len(paced_firsts)
    return burst(sent, paced_sent, unique=unique, done_keys=keys, drained=time.monotonic() - t0)


# --- 2. submissions --------------------------------------------------------------------------------
def submissions(
    args: argparse.Namespace, session: Session, servers: list[AsgiServer], token: str, check: Callable[[], None]
) -> Burst:
    from agents.models import Submission, SubmissionStatus, Turn

    rng = random.Random(2)

    def headers(key: str) -> Callable[[], dict[str, str]]:
        fixed = {"Content-Type": "application/json", "Authorization": f"Token {token}", "Idempotency-Key": key}
        return lambda: fixed

    def requested(prefix: str, count: int) -> list[Request]:
        return [
            Request(
                f"/api/agents/{KIND}/inbox-{i % AGENTS}/submissions",
                json.dumps({"messages": [{"role": "user", "content": "instant"}], "metadata": {"n": i}}).encode(),
                headers(f"{prefix}-{i}"),
            )
            for i in range(round(count * (1 - args.replays)))
        ]

    firsts, paced_firsts = requested("sub", args.submissions), requested("paced", paced_count(args))
    requests = with_replays(firsts, args.replays, rng)
    paced = with_replays(paced_firsts, args.replays, rng)
    say(f"submissions: {len(requests):,} requests ({len(requests) - len(firsts):,} replays) to {AGENTS} agents")
    sent, paced_sent = sent_with_worker(args, session, servers, requests, paced)
    t0 = time.monotonic()
    open_statuses = (SubmissionStatus.PENDING, SubmissionStatus.RUNNING)
    wait_until(
        lambda: not Submission.objects.filter(status__in=open_statuses).exists(),
        timeout=900,
        what="the submissions to run",
        check=check,
        interval=0.2,
    )
    drained = time.monotonic() - t0
    keys = list(Submission.objects.filter(status=SubmissionStatus.COMPLETED).values_list("idempotency_key", flat=True))
    unique = len(firsts) + len(paced_firsts)
    extra_turns = max(0, Turn.objects.filter(source="submission").count() - unique)
    return burst(sent, paced_sent, unique=unique, done_keys=keys, drained=drained, more_effects=extra_turns)


# --- 3. outcome ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    to_resume: list[float] = field(default_factory=list)  # webhook sent -> next step body starts
    answer: list[float] = field(default_factory=list)  # the webhook's own round trip


def outcome(args: argparse.Namespace, server: AsgiServer, check: Callable[[], None]) -> Outcome:
    from ledger.models import ExternalOperation, OperationStatus
    from ledger.services import request_fingerprint
    from workflows.models import StepResult, WorkflowRun
    from workflows.services import run_start

    res = Outcome()
    say(f"outcome: {args.outcomes} runs woken one at a time by the provider's webhook")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(args.outcomes):
            key = f"refund:bench:{i}"
            run, _ = run_start(workflow="bench.outcome", payload={"key": key})
            waiting = WorkflowRun.objects.filter(pk=run.pk, status="waiting")
            wait_until(
                waiting.exists,
                timeout=60,
                what="the run to wait for its outcome",
                check=check,
                interval=0.2,
            )
            request = {"order": str(i), "amount": "10.00"}
            ExternalOperation.objects.create(
                key=key,
                system="bench-payments",
                action="refund",
                request=request,
                request_hash=request_fingerprint(system="bench-payments", action="refund", request=request),
                status=OperationStatus.UNKNOWN,
                submit_count=1,
                run=run,
            )
            body = json.dumps({"type": "refund.succeeded", "data": {"key": key, "status": "succeeded"}}).encode()
            sent_at = time.time()
            response = client.post("/webhooks/bench-payments/", content=body, headers=signed(f"out_{i}", body)())
            res.answer.append(time.time() - sent_at)
            if response.status_code != 202:
                raise RuntimeError(f"the outcome webhook was answered {response.status_code}: {response.text}")
            step = StepResult.objects.filter(run=run, name="resumed", status="completed")
            wait_until(step.exists, timeout=60, what="the run to resume", check=check, interval=0.2)
            resumed = step.get().result  # the time.time() its body returned
            assert isinstance(resumed, float), resumed
            res.to_resume.append(resumed - sent_at)
    return res


# --- report ------------------------------------------------------------------------------------------
def floor_rows(sent: Sent, paced: Sent, args: argparse.Namespace) -> list[Row]:
    p50, p99 = percentile(sent.latencies, 0.5), percentile(sent.latencies, 0.99)
    paced50, paced99 = percentile(paced.latencies, 0.5), percentile(paced.latencies, 0.99)
    return [
        Row(f"floor: GET /healthz answered/s ({len(sent.statuses):,})", f"{sent.rate:,.0f}"),
        Row("  latency p50 / p99", f"{ms(p50)} / {ms(p99)}"),
        cpu_row(sent),
        Row(f"  offered {args.rate:,.0f}/s for {paced.seconds:.0f} s: answered/s", f"{paced.rate:,.0f}"),
        Row("    latency from due, p50 / p99", f"{ms(paced50)} / {ms(paced99)}"),
    ]


def cpu_row(sent: Sent) -> Row:
    """Each part's CPU a request, and the worker's when it ran meanwhile (``--worker during``)."""
    parts = ["servers", "postgres", "redis", "bench"] + (["worker"] if sent.cpu.get("worker") else [])
    names = "daphnes / PostgreSQL / Redis / client" + (" / worker" if "worker" in parts else "")
    cost = " / ".join(f"{sent.cpu[part] * 1000:.2f}" for part in parts)
    return Row(f"  CPU a request, ms: {names}", f"{cost} (all {sum(sent.cpu.values()) * 1000:.2f})")


def burst_rows(name: str, b: Burst, floor: Sent | None, args: argparse.Namespace) -> list[Row]:
    p50, p99 = percentile(b.sent.latencies, 0.5), percentile(b.sent.latencies, 0.99)
    paced50, paced99 = percentile(b.paced.latencies, 0.5), percentile(b.paced.latencies, 0.99)
    replays = f"{args.replays:.0%} replays"
    answered = f"{name}: answered/s, {args.clients} in flight ({len(b.sent.statuses):,}, {replays})"
    offered = f"  offered {args.rate:,.0f}/s for {b.paced.seconds:.0f} s ({len(b.paced.statuses):,}): answered/s"
    answers = f"{b.accepted:,} / {b.duplicates:,} / {b.refused:,}"
    versus = [Row("  against the floor", f"{b.sent.rate / floor.rate:.2f}x")] if floor else []
    return [
        Row(answered, f"{b.sent.rate:,.0f}", ">= 500", b.sent.rate >= 500),
        *versus,
        Row("  accepted/s (202, new work)", f"{b.sent.count(202) / b.sent.seconds:,.0f}"),
        Row("  latency p50 / p99 (saturated: queueing)", f"{ms(p50)} / {ms(p99)}"),
        cpu_row(b.sent),
        Row(offered, f"{b.paced.rate:,.0f}", f">= {0.98 * args.rate:,.0f}", b.paced.rate >= 0.98 * args.rate),
        Row("    latency from due, p50 / p99", f"{ms(paced50)} / {ms(paced99)}", "p99 <= 50 ms", paced99 <= 0.050),
        Row("  202 / 200 duplicate / other (both parts)", answers, "other 0", b.refused == 0),
        *(Row(f"    {status}", body[:60]) for status, body in sorted({**b.paced.refusals, **b.sent.refusals}.items())),
        Row("  duplicate effects", str(b.effects_twice), "0", b.effects_twice == 0),
        Row("  lost (accepted, never done)", str(b.lost), "0", b.lost == 0),
        Row("  then the worker drained in", f"{b.drain_seconds:.1f} s"),
    ]


def write_timeline(path: Path, parts: dict[str, Sent]) -> None:
    """--timeline: each paced request of each phase, as answered."""
    with path.open("w") as f:
        f.write("phase\tdue_s\tlatency_ms\tstatus\n")
        for phase, sent in parts.items():
            for due, latency, status in zip(sent.dues, sent.latencies, sent.statuses, strict=True):
                f.write(f"{phase}\t{due:.4f}\t{latency * 1000:.2f}\t{status}\n")
    say(f"timeline of the paced requests written to {path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_inbound_environment()
    rows: list[Row] = []
    probes: list[str] = []
    paced_parts: dict[str, Sent] = {}
    with bench_session(args) as session:
        from django.contrib.auth.models import User
        from rest_framework.authtoken.models import Token

        from accounts.services import account_ensure

        user = User.objects.create_user("bench-system", password="x")
        account_ensure(slug="bench", name="Bench", members=[user])
        token = Token.objects.create(user=user).key
        servers = [AsgiServer() for _ in range(args.web)]
        ok, server_errors = False, False
        try:
            session.start_worker()

            def check() -> None:
                for server in servers:
                    if server.process.poll() is not None:
                        raise RuntimeError(f"daphne exited:\n{Path(server.log.name).read_text()[-3000:]}")
                worker = session.worker
                if worker is not None and worker.process.poll() is not None:
                    raise RuntimeError(f"the worker exited:\n{worker.output()[-3000:]}")

            probes.append(probe_environment("before"))
            base = None
            if "floor" in args.phases:
                base, base_paced = floor(args, servers)
                rows += floor_rows(base, base_paced, args)
                paced_parts["floor"] = base_paced
            if "webhooks" in args.phases:
                burst = webhooks(args, session, servers, check)
                rows += burst_rows("webhooks", burst, base, args)
                paced_parts["webhooks"] = burst.paced
                server_errors |= 500 in burst.sent.refusals or 500 in burst.paced.refusals
            if "webhooks-later" in args.phases:
                burst = webhooks(args, session, servers, check, source="bench-runs-later")
                rows += burst_rows("webhooks, act: later", burst, base, args)
                paced_parts["webhooks-later"] = burst.paced
                server_errors |= 500 in burst.sent.refusals or 500 in burst.paced.refusals
            if "submissions" in args.phases:
                burst = submissions(args, session, servers, token, check)
                rows += burst_rows("submissions", burst, base, args)
                paced_parts["submissions"] = burst.paced
                server_errors |= 500 in burst.sent.refusals or 500 in burst.paced.refusals
            if "outcome" in args.phases:
                o = outcome(args, servers[0], check)
                p50, p99 = percentile(o.to_resume, 0.5), percentile(o.to_resume, 0.99)
                rows += [
                    Row(f"outcome webhook -> run resumed p50 ({len(o.to_resume)})", ms(p50), "<= 50 ms", p50 <= 0.050),
                    Row("  p99", ms(p99), "<= 250 ms", p99 <= 0.250),
                    Row("  the webhook's own answer p50", ms(percentile(o.answer, 0.5))),
                ]
            probes.append(probe_environment("after "))
            if args.timeline:
                write_timeline(args.timeline, paced_parts)
            ok = not server_errors
            if server_errors:
                say("some requests were answered 500: the daphne logs are kept")
        finally:
            for server in servers:
                server.stop()
                server.log.close()
                if ok:
                    Path(server.log.name).unlink(missing_ok=True)
                else:
                    say(f"daphne log kept: {server.log.name}")
    for probe in probes:
        print(probe)
    print_table(rows)
    print(f"""
How: {args.web} real daphne processes (as a deployment runs one per core) and one celery worker
(-c {args.concurrency}); {args.clients} kept-alive connections of this process on one asyncio loop,
spread evenly over the daphnes, then up to {PACED_CONNECTIONS} for the paced part of each burst
(a request sent when due, its latency counted from then). The floor is GET /healthz through the
same stack. A webhook is verified, deduplicated (the accepted row's unique index) and its work
started (run_start, enqueued on commit) before its 202; with "act: later", verified, its shape
checked, deduplicated and committed pending with its act task sent before its 202, and its run
started by the worker. A submission is authenticated by token and committed pending, by one
statement, with its queue task sent, before its 202; the worker queues and runs its turn.
Duplicate effects and lost work are counted from the database once the worker has run
everything. Outcome: an unknown ledger operation of a waiting bench.outcome run, settled by the
provider's signed webhook (operation_report), which wakes the run (ledger.wait_for_outcome); the
run's next step body records time.time().""")
    return 0


if __name__ == "__main__":
    run_main(main)
