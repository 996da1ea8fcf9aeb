#!/usr/bin/env python
"""Benchmark of the customer chat: turns' streams to WebSocket clients (not a test: it prints).

    .venv/bin/python bench/chat.py [--clients N] [--chunks C] [--rounds R] [--phases ...]

Self-contained like bench/engine.py (through bench/harness.py): its own PostgreSQL database (dropped
at the end), Redis db 12 (broker and channel layer), a private queue with one ``celery worker -P
prefork -c 2``, one real daphne serving the project, and the agent ``bench.chat``
(bench/chat_agents.py), whose model streams numbered deltas stamped with ``time.time()`` as it
yields them. The clients are ``websockets`` connections of this process, all on one asyncio loop,
signed in with a session cookie as a browser is.

1. delivery: N clients connected to one agent; R turns whose model yields a delta every 1/rate
   seconds. Latency = a client's receive time - the delta's yield time, over every client and
   delta. Lost: stored seqs of the turn a client never received; duplicated: received twice.
2. throughput: R turns of C deltas with the model yielding as fast as the model step takes them:
   text deltas stored per second of the model step (ChunkWriter batches, each INSERT fenced by the
   lease, pushed after its commit); one connected client: deltas delivered per second.
3. replay: reconnects to a turn still streaming after C deltas, as the chat page reconnects: the
   socket's URL names the newest message the page has (``?since=``: the turn's question) and it
   sends ``resume {turn, after}`` at once, without waiting for the snapshot; time from the connect
   to the first replayed chunk, ``after`` spread over the turn. Also the older way: reconnect with
   no ``since``, read the whole snapshot, then resume.
4. overhead: turns of a model that answers at once, one at a time: ``message_send`` called here ->
   the turn's ``finished_at`` (written by the worker). The model's own time is nil.
5. kill: two workers of one process each; a paced turn; SIGKILL the process group holding its
   run's lease mid-stream. The lease expires, the sweeper (a thread here, every
   WORKFLOWS_SWEEP_INTERVAL, as beat would run it) enqueues the run again, the other worker
   continues the round; time from the SIGKILL to a connected client receiving the next chunk.

The figures, their targets and PASS/MISS are printed as a table. It exits 0 once printed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar
from uuid import UUID

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # as in bench/engine.py: bench/ would shadow workflows

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.typing import Origin  # noqa: E402

from bench.harness import (  # noqa: E402
    Row,
    add_session_arguments,
    bench_session,
    discard_worker,
    ms,
    no_collector_pauses,
    parse_phases,
    percentile,
    print_table,
    probe_environment,
    run_main,
    say,
    server_settings,
    wait_until,
)
from tests.support import AsgiServer, Worker  # noqa: E402

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from agents.models import Agent, Turn

T = TypeVar("T")
KIND = "bench.chat"  # bench.chat_agents.KIND (not imported before django.setup())
PHASES = {"delivery", "throughput", "replay", "overhead", "kill"}
SWEEP_INTERVAL = 0.5
ENQUEUE_GRACE = 2.0


# --- arguments -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", "-N", type=int, default=100, help="clients connected in delivery (default 100)")
    p.add_argument("--rate", type=float, default=20.0, help="deltas per second of the paced model (default 20)")
    p.add_argument(
        "--paced-chunks", type=int, default=300, help="deltas of a delivery turn (default 300: 15 s at 20/s)"
    )
    p.add_argument(
        "--chunks", "-C", type=int, default=10_000, help="deltas of a throughput turn, replayed (default 10,000)"
    )
    p.add_argument("--rounds", "-R", type=int, default=3, help="delivery turns and throughput turns (default 3)")
    p.add_argument("--reconnects", type=int, default=60, help="reconnects to the long turn (default 60)")
    p.add_argument("--turns", type=int, default=50, help="instant turns for the overhead (default 50)")
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs mid-turn (default 3)")
    p.add_argument("--kill-clients", type=int, default=5, help="clients connected during the kills (default 5)")
    p.add_argument("--lease", type=float, default=5.0, help="WORKFLOWS_LEASE_SECONDS of the workers (default 5)")
    p.add_argument(
        "--phases",
        default=",".join(sorted(PHASES)),
        help="comma-separated subset of delivery,throughput,replay,overhead,kill (default all)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also advance one --chunks turn in this process under cProfile (wall time) and print where it goes",
    )
    add_session_arguments(p, database="durable_bench_chat", redis="redis://127.0.0.1:6379/12")
    args = p.parse_args(argv)
    args.phases = parse_phases(p, args.phases, PHASES)
    if min(args.clients, args.paced_chunks, args.chunks, args.rounds, args.reconnects, args.turns) < 1:
        p.error("--clients, --paced-chunks, --chunks, --rounds, --reconnects and --turns must be at least 1")
    if args.rate <= 0 or args.lease < 1:
        p.error("--rate must be positive and --lease at least 1 s")
    return args


def configure_chat_environment(args: argparse.Namespace) -> None:
    """Before Django reads its settings; the worker and daphne processes inherit it."""
    os.environ.update(
        {
            "AGENTS_MODULES": "bench.chat_agents",
            "WORKFLOWS_LEASE_SECONDS": f"{args.lease:g}",
            "WORKFLOWS_ENQUEUE_GRACE_SECONDS": f"{ENQUEUE_GRACE:g}",
            "WORKFLOWS_SWEEP_INTERVAL": f"{SWEEP_INTERVAL:g}",
        }
    )


# --- the clients: sockets on one asyncio loop of their own ---------------------------------------
@dataclass(frozen=True)
class Target:
    """Where an agent's chat socket is, and the session cookie and Origin a browser would send."""

    url: str
    origin: str
    cookie: str


class Received(NamedTuple):
    seq: int
    type: str
    at: float  # time.time() as the frame was read
    data: Any


async def open_socket(target: Target) -> ClientConnection:
    # No pings (a browser sends none); no size limit (a replay's frames are small, but many).
    return await connect(
        target.url,
        origin=Origin(target.origin),
        additional_headers={"Cookie": target.cookie},
        proxy=None,
        open_timeout=60,
        ping_interval=None,
        max_size=None,
    )


class ChatClient:
    """One connected socket: every chunk frame it reads, by turn, with the time it was read."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.chunks: defaultdict[str, list[Received]] = defaultdict(list)
        self.finished: set[str] = set()  # turns whose ``finish`` chunk arrived
        self.reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, target: Target) -> ChatClient:
        ws = await open_socket(target)
        first = json.loads(await ws.recv())
        if first.get("type") != "snapshot":
            raise RuntimeError(f"expected the snapshot first, got {first!r:.300}")
        client = cls(ws)
        client.reader = asyncio.create_task(client.read())
        return client

    async def read(self) -> None:
        try:
            async for raw in self.ws:
                at = time.time()
                frame = json.loads(raw)
                if frame["type"] == "chunk":
                    turn = frame["turn"]
                    self.chunks[turn].append(Received(frame["seq"], frame["chunk_type"], at, frame["data"]))
                    if frame["chunk_type"] == "finish":
                        self.finished.add(turn)
                elif frame["type"] == "error":
                    say(f"a client got an error frame: {frame}")
        except ConnectionClosed:
            pass

    async def close(self) -> None:
        await self.ws.close()
        if self.reader is not None:
            await self.reader


class Fleet:
    """Chat clients on an asyncio loop in a thread of its own: the main thread uses Django's ORM,
    which refuses to run inside an event loop. One process, one loop, as a load generator."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="chat-clients", daemon=True)
        self.thread.start()
        self.clients: list[ChatClient] = []

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def connect(self, target: Target, n: int) -> list[ChatClient]:
        async def all_of_them() -> list[ChatClient]:
            handshakes = asyncio.Semaphore(10)  # at most 10 handshakes in flight: a page load, not a flood

            async def one() -> ChatClient:
                async with handshakes:
                    return await ChatClient.open(target)

            return list(await asyncio.gather(*(one() for _ in range(n))))

        clients = self.call(all_of_them())
        self.clients += clients
        return clients

    def disconnect(self, clients: list[ChatClient]) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

        self.call(close_all(), timeout=60)
        self.clients = [c for c in self.clients if c not in clients]

    def close(self) -> None:
        if self.clients:
            self.disconnect(list(self.clients))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str, check: Callable[[], None]) -> None:
    wait_until(predicate, timeout=timeout, what=what, check=check, interval=0.01)


def yield_time(r: Received) -> float:
    """When the model yielded a text delta ``"<i>:<t> "``."""
    return float(str(r.data["delta"]).split(":")[1])


def delta_number(r: Received) -> int:
    return int(str(r.data["delta"]).split(":")[0])


def deltas(client: ChatClient, turn_id: str) -> list[Received]:
    return [r for r in client.chunks.get(turn_id, []) if r.type == "text-delta"]


def lost_and_duplicated(clients: list[ChatClient], turn_id: str) -> tuple[int, int]:
    """Summed over the clients: stored seqs of the turn a client did not receive, and seqs it
    received more than once."""
    from agents.models import Chunk

    stored = set(Chunk.objects.filter(turn_id=turn_id).values_list("seq", flat=True))
    lost = duplicated = 0
    for c in clients:
        seqs = [r.seq for r in c.chunks.get(turn_id, [])]
        duplicated += len(seqs) - len(set(seqs))
        lost += len(stored - set(seqs))
    return lost, duplicated


# --- the world: a customer, an account, agents, a daphne -----------------------------------------
@dataclass
class World:
    user: User
    server: AsgiServer
    cookie: str
    fleet: Fleet
    check: Callable[[], None]  # raises if a process the bench needs has exited

    def agent(self, name: str) -> Agent:
        from agents.selectors import agent_get

        found = agent_get(user=self.user, kind=KIND, name=name)
        assert found is not None
        return found

    def target(self, agent: Agent) -> Target:
        return Target(f"{self.server.ws_url}/ws/agents/{KIND}/{agent.name}/", self.server.url, self.cookie)

    def send(self, agent: Agent, text: str) -> Turn:
        from agents.services import message_send

        return message_send(agent=agent, user=self.user, text=text)


def customer() -> tuple[User, str]:
    """A member of the account ``bench``, and the session cookie of a sign-in."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    from accounts.services import account_ensure

    user = User.objects.create_user("bench-customer", password="x")
    account_ensure(slug="bench", name="Bench", members=[user])
    client = Client()
    client.force_login(user)
    return user, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def wait_delivered(world: World, clients: list[ChatClient], turn: Turn, grace: float) -> bool:
    """Until every client has the turn's ``finish`` chunk, or ``grace`` seconds after the turn
    ended: a push the channel layer dropped at the end of a stream is filled by nothing but a
    resume, and what never came counts as lost. False if some client missed the finish."""
    from agents.models import TURN_ENDED
    from agents.models import Turn as TurnModel

    key = str(turn.pk)
    ended_at: float | None = None
    while not all(key in c.finished for c in clients):
        world.check()
        if ended_at is None and TurnModel.objects.filter(pk=turn.pk, status__in=TURN_ENDED).exists():
            ended_at = time.monotonic()
        if ended_at is not None and time.monotonic() - ended_at > grace:
            say(f"  {sum(key not in c.finished for c in clients)} clients never got the finish of turn {turn.number}")
            return False
        time.sleep(0.05)
    return True


def wait_finished(world: World, clients: list[ChatClient], turn: Turn, timeout: float) -> None:
    """Until every client has the turn's ``finish`` chunk; on a timeout, what each had is said."""
    from agents.models import Turn as TurnModel
    from agents.selectors import turn_seq

    key = str(turn.pk)
    try:
        wait_for(
            lambda: all(key in c.finished for c in clients),
            timeout=timeout,
            what=f"{len(clients)} clients to receive turn {turn.number}'s finish",
            check=world.check,
        )
    except RuntimeError:
        status = TurnModel.objects.filter(pk=turn.pk).values_list("status", flat=True).get()
        got = sorted(len(c.chunks.get(key, [])) for c in clients)
        say(
            f"turn {turn.number} is {status} with {turn_seq(turn_id=turn.pk)} chunks stored; "
            f"{sum(key in c.finished for c in clients)} of {len(clients)} clients have its finish; "
            f"chunks received min {got[0]}, median {got[len(got) // 2]}, max {got[-1]}"
        )
        raise


def run_of(turn: Turn) -> UUID:
    if turn.run_id is None:
        raise RuntimeError(f"turn {turn.number} has no run")
    return turn.run_id


def turn_ended(turn: Turn) -> Turn:
    from agents.models import TURN_ENDED
    from agents.models import Turn as TurnModel

    fresh = TurnModel.objects.get(pk=turn.pk)
    if fresh.status not in TURN_ENDED:
        raise RuntimeError(f"turn {turn.number} is {fresh.status}")
    if fresh.status != "completed":
        raise RuntimeError(f"turn {turn.number} ended {fresh.status}: {fresh.end_reason}")
    return fresh


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- 1. delivery ---------------------------------------------------------------------------------
@dataclass
class Delivery:
    clients: int
    latencies: list[float] = field(default_factory=list)  # every client x every delta
    last_client: list[float] = field(default_factory=list)  # per delta: until the last client had it
    stored: list[float] = field(default_factory=list)  # per delta: yield -> its row's created_at
    round_p99: list[float] = field(default_factory=list)
    daphne_cpu: list[float] = field(default_factory=list)  # per round: CPU seconds / wall seconds
    clients_cpu: list[float] = field(default_factory=list)  # this process (the clients' loop, mostly)
    lost: int = 0
    duplicated: int = 0
    deltas: int = 0


def paced(n: int, rate: float) -> str:
    return f"paced {n} {1 / rate:.6f}"


def stored_at(turn_id: str) -> dict[int, float]:
    from agents.models import Chunk

    rows = Chunk.objects.filter(turn_id=turn_id).values_list("seq", "created_at")
    return {seq: created.timestamp() for seq, created in rows}


def delivery(args: argparse.Namespace, world: World) -> Delivery:
    agent = world.agent("delivery")
    say(f"delivery: connecting {args.clients} clients")
    clients = world.fleet.connect(world.target(agent), args.clients)
    out = Delivery(len(clients))
    seconds = args.paced_chunks / args.rate
    try:
        warm = world.send(agent, paced(20, args.rate))  # the worker's and daphne's first turn: imports, connections
        wait_finished(world, clients, warm, timeout=120)
        for r in range(args.rounds):
            say(f"delivery round {r + 1}: {args.paced_chunks} deltas at {args.rate:g}/s to {len(clients)} clients")
            cpu0, own0, t0 = cpu_seconds(world.server.process.pid), time.process_time(), time.monotonic()
            # The clients stamp each delta as they read it: a collection of this process's would
            # be timed as the server's delay (bench/inbound.py found a 200 ms one).
            with no_collector_pauses():
                turn = world.send(agent, paced(args.paced_chunks, args.rate))
                wait_delivered(world, clients, turn, grace=max(30.0, seconds))
            wall = time.monotonic() - t0
            out.daphne_cpu.append((cpu_seconds(world.server.process.pid) - cpu0) / wall)
            out.clients_cpu.append((time.process_time() - own0) / wall)
            turn_ended(turn)
            key = str(turn.pk)
            created = stored_at(key)
            by_seq: defaultdict[int, list[float]] = defaultdict(list)
            this_round: list[float] = []
            for c in clients:
                for d in deltas(c, key):
                    latency = d.at - yield_time(d)
                    this_round.append(latency)
                    by_seq[d.seq].append(d.at)
            for c in clients[:1]:
                for d in deltas(c, key):
                    out.stored.append(created[d.seq] - yield_time(d))
                    out.last_client.append(max(by_seq[d.seq]) - yield_time(d))
            lost, duplicated = lost_and_duplicated(clients, key)
            out.lost += lost
            out.duplicated += duplicated
            out.latencies += this_round
            out.round_p99.append(percentile(this_round, 0.99))
            out.deltas += len(deltas(clients[0], key))
            say(
                f"  p50 {ms(percentile(this_round, 0.5))}, p99 {ms(percentile(this_round, 0.99))}, "
                f"lost {lost}, duplicated {duplicated}; CPU: daphne {out.daphne_cpu[-1]:.0%}, "
                f"the clients' process {out.clients_cpu[-1]:.0%} of a core"
            )
    finally:
        world.fleet.disconnect(clients)
    return out


# --- 2. throughput, 3. replay --------------------------------------------------------------------
@dataclass
class Throughput:
    stored_rates: list[float] = field(default_factory=list)  # text deltas / model step seconds
    delivered_rates: list[float] = field(default_factory=list)  # to the one connected client
    step_seconds: list[float] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0


def model_step_seconds(turn: Turn) -> float:
    from workflows.models import StepResult

    step = StepResult.objects.filter(run_id=turn.run_id, name="model 1").order_by("-attempt").first()
    if step is None or step.started_at is None or step.finished_at is None:
        raise RuntimeError(f"turn {turn.number}: no finished model step")
    return (step.finished_at - step.started_at).total_seconds()


def throughput(args: argparse.Namespace, world: World) -> Throughput:
    from agents.models import Chunk

    agent = world.agent("throughput")
    clients = world.fleet.connect(world.target(agent), 1)
    out = Throughput()
    try:
        warm = world.send(agent, "fast 500")
        wait_finished(world, clients, warm, timeout=120)
        for r in range(args.rounds):
            turn = world.send(agent, f"fast {args.chunks}")
            wait_finished(world, clients, turn, timeout=300)
            turn = turn_ended(turn)
            key = str(turn.pk)
            seconds = model_step_seconds(turn)
            stored = Chunk.objects.filter(turn_id=key, type="text-delta").count()
            got = deltas(clients[0], key)
            delivered = len(got) / (max(d.at for d in got) - yield_time(got[0]))
            lost, duplicated = lost_and_duplicated(clients, key)
            out.stored_rates.append(stored / seconds)
            out.delivered_rates.append(delivered)
            out.step_seconds.append(seconds)
            out.lost += lost
            out.duplicated += duplicated
            say(
                f"throughput round {r + 1}: {stored:,} deltas stored in a {seconds:.2f} s model step "
                f"({stored / seconds:,.0f}/s); delivered {delivered:,.0f}/s to a client"
            )
    finally:
        world.fleet.disconnect(clients)
    return out


@dataclass
class Replay:
    chunks: int = 0
    first: list[float] = field(default_factory=list)  # connect -> first replayed chunk (the page's way)
    after_resume: list[float] = field(default_factory=list)  # resume sent -> first replayed chunk
    snapshot: list[float] = field(default_factory=list)  # connect -> snapshot read
    complete_rates: list[float] = field(default_factory=list)  # replayed chunks / (connect -> replay_complete)
    waited: list[float] = field(default_factory=list)  # the same with no since, resume after the snapshot
    worst_after: int = 0


class Reconnect(NamedTuple):
    snapshot: float  # seconds from the start of the connect to the snapshot read
    first: float  # to the first replayed chunk
    after_resume: float  # from the resume sent to the first replayed chunk
    complete: float  # to replay_complete
    replayed: int  # chunks replayed


async def reconnect_once(target: Target, turn_id: str, after: int, *, since: int | None) -> Reconnect:
    """Reconnect and resume after ``after``. With ``since`` as the chat page does: that in the URL,
    and the resume sent as the socket opens; without, the resume waits for the whole snapshot."""
    t0 = time.perf_counter()
    resume = json.dumps({"type": "resume", "turn": turn_id, "after": after})
    if since is not None:
        target = Target(f"{target.url}{'&' if '?' in target.url else '?'}since={since}", target.origin, target.cookie)
    ws = await open_socket(target)
    try:
        t_resume = 0.0
        if since is not None:
            await ws.send(resume)
            t_resume = time.perf_counter()
        if json.loads(await ws.recv()).get("type") != "snapshot":
            raise RuntimeError("expected the snapshot first")
        t_snapshot = time.perf_counter()
        if since is None:
            await ws.send(resume)
            t_resume = time.perf_counter()
        first = 0.0
        count = 0
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "chunk" and frame.get("replay"):
                if not count:
                    first = time.perf_counter()
                count += 1
            elif frame["type"] == "replay_complete":
                done = time.perf_counter()
                return Reconnect(t_snapshot - t0, first - t0, first - t_resume, done - t0, count)
            elif frame["type"] == "error":
                raise RuntimeError(f"resume refused: {frame}")
        raise RuntimeError("the socket closed before replay_complete")
    finally:
        await ws.close()


def replay(args: argparse.Namespace, world: World) -> Replay:
    from agents.models import TURN_ENDED, Message
    from agents.models import Turn as TurnModel
    from agents.selectors import turn_seq
    from agents.services import turn_stop

    agent = world.agent("replay")
    turn = world.send(agent, f"hold {args.chunks}")
    question = Message.objects.filter(agent=agent).latest("id").pk  # the newest message a page has
    wait_for(
        lambda: turn_seq(turn_id=turn.pk) > args.chunks,  # its start chunk and C deltas
        timeout=300,
        what=f"{args.chunks:,} deltas of the turn",
        check=world.check,
    )
    top = turn_seq(turn_id=turn.pk)
    afters = [round(i * (top - 1) / max(args.reconnects - 1, 1)) for i in range(args.reconnects)]
    random.Random(8).shuffle(afters)
    out = Replay(chunks=top)
    target = world.target(agent)
    say(f"replay: {args.reconnects} reconnects to a streaming turn of {top:,} chunks, resuming after 0..{top - 1:,}")
    worst = -1.0
    try:
        for after in afters:
            got = world.fleet.call(reconnect_once(target, str(turn.pk), after, since=question))
            if got.replayed < top - after:
                raise RuntimeError(f"resume after {after}: {got.replayed} chunks replayed, expected {top - after}+")
            out.snapshot.append(got.snapshot)
            out.first.append(got.first)
            out.after_resume.append(got.after_resume)
            out.complete_rates.append(got.replayed / got.complete)
            if got.first > worst:
                worst, out.worst_after = got.first, after
            waited = world.fleet.call(reconnect_once(target, str(turn.pk), after, since=None))
            out.waited.append(waited.first)
            world.check()
    finally:
        turn_stop(turn=TurnModel.objects.select_related("agent").get(pk=turn.pk), user=world.user)
        ended = TurnModel.objects.filter(pk=turn.pk, status__in=TURN_ENDED)
        wait_for(ended.exists, timeout=60, what="the held turn to stop", check=world.check)
    return out


# --- 4. overhead ---------------------------------------------------------------------------------
@dataclass
class Overhead:
    totals: list[float] = field(default_factory=list)  # message_send called -> turn finished_at
    send_calls: list[float] = field(default_factory=list)  # message_send's own time (its commit)
    to_start: list[float] = field(default_factory=list)  # message_send called -> run started_at
    steps: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    gaps: list[float] = field(default_factory=list)  # run started -> turn finished, minus the steps' bodies


def overhead(args: argparse.Namespace, world: World) -> Overhead:
    from agents.models import TURN_ENDED
    from agents.models import Turn as TurnModel
    from workflows.models import StepResult, WorkflowRun

    agent = world.agent("overhead")
    out = Overhead()
    say(f"overhead: {args.turns} turns of an instant model, one at a time")

    def one() -> tuple[float, float, Turn]:
        t0 = time.time()
        turn = world.send(agent, "instant")
        called = time.time() - t0
        ended = TurnModel.objects.filter(pk=turn.pk, status__in=TURN_ENDED)
        wait_for(ended.exists, timeout=60, what=f"turn {turn.number} to end", check=world.check)
        return t0, called, turn_ended(turn)

    for _ in range(3):  # warm-up
        one()
    for _ in range(args.turns):
        t0, called, turn = one()
        assert turn.finished_at is not None
        run = WorkflowRun.objects.get(pk=run_of(turn))
        assert run.started_at is not None
        out.totals.append(turn.finished_at.timestamp() - t0)
        out.send_calls.append(called)
        out.to_start.append(run.started_at.timestamp() - t0)
        bodies = 0.0
        for name, started, finished in StepResult.objects.filter(run=run).values_list(
            "name", "started_at", "finished_at"
        ):
            if started is not None and finished is not None:
                out.steps[name].append((finished - started).total_seconds())
                # The round that answers ends the turn inside its body: only up to then counts.
                bodies += max(0.0, (min(finished, turn.finished_at) - started).total_seconds())
        out.gaps.append((turn.finished_at - run.started_at).total_seconds() - bodies)
        time.sleep(0.02)  # one at a time, with the worker idle in between
    return out


# --- 5. kill -------------------------------------------------------------------------------------
@dataclass
class Kill:
    lease: float
    seconds: list[float] = field(default_factory=list)  # SIGKILL -> next chunk at a connected client
    lease_left: list[float] = field(default_factory=list)  # SIGKILL -> the lease's expiry
    lost: int = 0
    duplicated: int = 0
    complete: list[bool] = field(default_factory=list)  # the answer is deltas 1..n, once each, in order
    recoveries: list[int] = field(default_factory=list)


class Sweeper:
    """``workflows.sweeper.sweep()`` every SWEEP_INTERVAL in a thread, what beat's workflows-sweep
    does in a deployment (here without the hop through the queue)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="sweeper", daemon=True)

    def run(self) -> None:
        from django.db import connection

        from workflows.sweeper import sweep

        try:
            while not self.stopping.wait(SWEEP_INTERVAL):
                sweep()
        finally:
            connection.close()

    def __enter__(self) -> Sweeper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)


def small_worker() -> Worker:
    return Worker(concurrency=1, beat=False, loglevel="WARNING", DATABASE_URL=os.environ["DATABASE_URL"])


def holder(turn: Turn, workers: list[Worker]) -> Worker:
    """The worker whose process holds the turn's run's lease (owner ``host:pid:nonce``)."""
    from workflows.models import WorkflowRun

    owner = WorkflowRun.objects.filter(pk=run_of(turn)).values_list("lease_owner", flat=True).get()
    pgid = os.getpgid(int(owner.split(":")[1]))
    return next(w for w in workers if w.process.pid == pgid)


def has_deltas(client: ChatClient, key: str, n: int) -> Callable[[], bool]:
    return lambda: len(deltas(client, key)) >= n


def has_chunk_after(client: ChatClient, key: str, seq: int) -> Callable[[], bool]:
    return lambda: any(r.seq > seq for r in client.chunks[key])


def kill(args: argparse.Namespace, world: World) -> Kill:
    from django.db.models import Max

    from agents.models import Chunk
    from workflows.models import WorkflowRun

    out = Kill(args.lease)
    workers = [small_worker(), small_worker()]
    ok = False
    agent = world.agent("kill")

    def check() -> None:
        world.check()
        for w in workers:
            if w.process.poll() is not None:
                raise RuntimeError(f"a worker exited:\n{w.output()[-3000:]}")

    n = int(args.rate * 12)  # 12 s of answer: killed after 2.5 s, the rest after the recovery
    try:
        with Sweeper():
            clients = world.fleet.connect(world.target(agent), args.kill_clients)
            warm = world.send(agent, "instant")
            wait_finished(world, clients, warm, timeout=120)
            for k in range(args.kills):
                turn = world.send(agent, paced(n, args.rate))
                key = str(turn.pk)
                wait_for(
                    has_deltas(clients[0], key, int(args.rate * 2.5)),
                    timeout=60,
                    what="the turn to stream",
                    check=check,
                )
                victim = holder(turn, workers)
                t_kill = time.time()
                victim.kill()
                expires = WorkflowRun.objects.filter(pk=run_of(turn)).values_list("lease_expires_at", flat=True).get()
                top = int(Chunk.objects.filter(turn_id=key).aggregate(m=Max("seq"))["m"] or 0)
                workers.remove(victim)
                discard_worker(victim, keep_log=False)
                wait_for(
                    has_chunk_after(clients[0], key, top),
                    timeout=args.lease + 60,
                    what="the next chunk after the SIGKILL",
                    check=check,
                )
                first = min(r.at for r in clients[0].chunks[key] if r.seq > top)
                out.seconds.append(first - t_kill)
                out.lease_left.append(expires.timestamp() - t_kill if expires else float("nan"))
                say(
                    f"kill {k + 1}: SIGKILL after seq {top}; the next chunk {first - t_kill:.2f} s later "
                    f"(the lease had {out.lease_left[-1]:.2f} s left)"
                )
                workers.append(small_worker())  # the replacement a supervisor would start
                wait_finished(world, clients, turn, timeout=n / args.rate + args.lease + 60)
                ended = turn_ended(turn)
                lost, duplicated = lost_and_duplicated(clients, key)
                out.lost += lost
                out.duplicated += duplicated
                out.complete.append(
                    all([delta_number(d) for d in deltas(c, key)] == list(range(1, n + 1)) for c in clients)
                )
                out.recoveries.append(ended.recoveries)
            world.fleet.disconnect(clients)
        ok = True
    finally:
        for w in workers:
            discard_worker(w, keep_log=not ok)
    return out


# --- profile -------------------------------------------------------------------------------------
def profile_turn(args: argparse.Namespace, world: World) -> None:
    """One ``fast`` turn advanced by ``workflows.engine.advance`` in this process (no worker is
    running: its Celery message waits, and finds the run finished later), under cProfile."""
    from workflows import engine

    agent = world.agent("profile")
    turn = world.send(agent, f"fast {args.chunks}")
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    outcome = engine.advance(run_of(turn))
    profiler.disable()
    seconds = time.perf_counter() - t0
    turn_ended(turn)
    print(
        f"\ncProfile (wall time) of one {args.chunks:,}-delta turn advanced in this process: {seconds:.2f} s, {outcome}"
    )
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(35)
    stats.sort_stats("tottime").print_stats(25)


# --- output --------------------------------------------------------------------------------------
@dataclass
class Results:
    probes: list[str] = field(default_factory=list)
    delivery: Delivery | None = None
    throughput: Throughput | None = None
    replay: Replay | None = None
    overhead: Overhead | None = None
    kill: Kill | None = None


def p50_p99(values: Sequence[float]) -> str:
    return f"{ms(percentile(values, 0.5))} / {ms(percentile(values, 0.99))}"


def report(args: argparse.Namespace, res: Results) -> None:
    version, sync_commit = server_settings("server_version", "synchronous_commit")
    print(
        f"\nChat benchmark  ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, PostgreSQL "
        f"{version.split()[0]} synchronous_commit={sync_commit}; one daphne, celery worker -P prefork "
        f"-c {args.concurrency}, Redis {args.redis}; clients in this process)"
    )
    for probe in res.probes:
        print(f"machine {probe}")
    rows: list[Row] = []
    d = res.delivery
    if d is not None:
        p50, p99 = percentile(d.latencies, 0.5), percentile(d.latencies, 0.99)
        shape = f"{d.clients} clients, {args.rate:g}/s"
        rows += [
            Row(f"chunk delivery p50, {shape}", ms(p50)),
            Row(f"chunk delivery p99, {shape}", ms(p99), "<= 100 ms", p99 <= 0.100),
            Row("  p99 of each round", " / ".join(ms(x) for x in d.round_p99)),
            Row("  yield -> stored (row's created_at) p50 / p99", p50_p99(d.stored)),
            Row("  yield -> the last of the clients p50 / p99", p50_p99(d.last_client)),
            Row(
                "  CPU of a core: daphne / the clients' process",
                f"{percentile(d.daphne_cpu, 0.5):.0%} / {percentile(d.clients_cpu, 0.5):.0%}",
            ),
            Row("chunks lost (all clients, all rounds)", str(d.lost), "0", d.lost == 0),
            Row("chunks duplicated", str(d.duplicated), "0", d.duplicated == 0),
        ]
    t = res.throughput
    if t is not None:
        stored = percentile(t.stored_rates, 0.5)
        rows += [
            Row(
                f"chunks stored+published/s, {args.chunks:,}-delta turn",
                f"{stored:,.0f}",
                ">= 10,000",
                stored >= 10_000,
            ),
            Row("  each round", " / ".join(f"{x:,.0f}" for x in t.stored_rates)),
            Row("  delivered/s to one connected client", f"{percentile(t.delivered_rates, 0.5):,.0f}"),
            Row(
                "  chunks lost / duplicated at that client",
                f"{t.lost} / {t.duplicated}",
                "0 / 0",
                t.lost + t.duplicated == 0,
            ),
        ]
    r = res.replay
    if r is not None:
        p99 = percentile(r.first, 0.99)
        rows += [
            Row(f"reconnect -> first replayed chunk p50, {r.chunks:,}", ms(percentile(r.first, 0.5))),
            Row(f"reconnect -> first replayed chunk p99, {r.chunks:,}", ms(p99), "<= 50 ms", p99 <= 0.050),
            Row("  connect -> snapshot p50 / p99", p50_p99(r.snapshot)),
            Row("  resume sent -> first replayed chunk p50 / p99", p50_p99(r.after_resume)),
            Row("  whole replay, chunks/s p50", f"{percentile(r.complete_rates, 0.5):,.0f}"),
            Row("  no since, resume after the snapshot p50 / p99", p50_p99(r.waited)),
        ]
    o = res.overhead
    if o is not None:
        p50 = percentile(o.totals, 0.5)
        rows += [
            Row("turn overhead p50 (instant model)", ms(p50), "<= 15 ms", p50 <= 0.015),
            Row("  p99", ms(percentile(o.totals, 0.99))),
            Row("  message_send's own call p50", ms(percentile(o.send_calls, 0.5))),
            Row("  send -> run started (commit, queue, claim)", ms(percentile(o.to_start, 0.5))),
        ]
        for name in ("load", "model 1", "finish"):  # load and finish: runs of agents.turn version 1
            if name in o.steps:
                rows.append(Row(f"  step {name!r} body p50", ms(percentile(o.steps[name], 0.5))))
        rows.append(Row("  run started -> turn finished, not in bodies", ms(percentile(o.gaps, 0.5))))
    k = res.kill
    if k is not None and k.seconds:
        worst = max(k.seconds)
        rows += [
            Row(
                f"SIGKILL -> next chunk delivered, max of {len(k.seconds)}",
                f"{worst:.2f} s",
                f"<= lease + 2 s = {k.lease + 2:g} s",
                worst <= k.lease + 2,
            ),
            Row("  each", " / ".join(f"{x:.2f} s" for x in k.seconds)),
            Row("  of which the lease's remaining time", " / ".join(f"{x:.2f} s" for x in k.lease_left)),
            Row(
                "  chunks lost / duplicated (connected clients)",
                f"{k.lost} / {k.duplicated}",
                "0 / 0",
                k.lost + k.duplicated == 0,
            ),
            Row(
                "  answers whole (1..n once, in order)",
                f"{sum(k.complete)} of {len(k.complete)}",
                "all",
                all(k.complete),
            ),
        ]
    print_table(rows)
    print(f"""
How: a real daphne and celery worker; clients are websockets connections of this process (one asyncio
loop), signed in by session cookie. The model (bench/chat_agents.py) stamps each delta with time.time()
as it yields it; a client's latency is its read time minus that stamp, so it includes the ChunkWriter's
batching and fenced INSERT, the commit, the push through the channel layer, daphne's consumer and the
client loop (100 sockets read by one Python thread). Delivery: {args.rounds} turns of {args.paced_chunks} deltas at
{args.rate:g}/s. Throughput: the model step's duration from its step row. Replay: a turn still streaming after
{args.chunks:,} deltas; each reconnect names the newest message in ?since= and sends its resume as the socket
opens, as the chat page does; 'after' spread evenly over the turn. Overhead: message_send here -> the turn's
finished_at (worker).
Kill: two workers of one process, WORKFLOWS_LEASE_SECONDS={args.lease:g}, the sweeper every {SWEEP_INTERVAL:g} s.""")


# --- main ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_chat_environment(args)
    res = Results()
    with bench_session(args) as session:
        user, cookie = customer()
        server = AsgiServer()
        fleet = Fleet()
        ok = False
        try:
            worker = session.start_worker()

            def check() -> None:
                if server.process.poll() is not None:
                    raise RuntimeError(f"daphne exited:\n{Path(server.log.name).read_text()[-3000:]}")
                if session.worker is not None and session.worker.process.poll() is not None:
                    raise RuntimeError(f"the worker exited:\n{worker.output()[-3000:]}")

            world = World(user, server, cookie, fleet, check)
            res.probes.append(probe_environment("before"))
            if "delivery" in args.phases:
                res.delivery = delivery(args, world)
            if "throughput" in args.phases:
                res.throughput = throughput(args, world)
            if "replay" in args.phases:
                res.replay = replay(args, world)
            if "overhead" in args.phases:
                res.overhead = overhead(args, world)
            session.stop_worker()
            if args.profile:
                profile_turn(args, world)
            if "kill" in args.phases:
                say(f"kill: {args.kills} SIGKILLs mid-turn, two workers, lease {args.lease:g} s")
                res.kill = kill(args, world)
            res.probes.append(probe_environment("after "))
            ok = True
        finally:
            fleet.close()
            server.stop()
            server.log.close()
            if ok:
                Path(server.log.name).unlink(missing_ok=True)
            else:
                say(f"daphne log kept: {server.log.name}")
        report(args, res)
    return 0


if __name__ == "__main__":
    run_main(main)
