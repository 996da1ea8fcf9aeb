#!/usr/bin/env python
"""The fault campaign: a mixed load for a fixed time while processes are killed and servers
restarted at random, then checks from the outside (not a timed test: it prints figures).

    .venv/bin/python bench/chaos.py [--minutes 10] [--faults-per-minute 16] [--workers 2] [--seed N]
    .venv/bin/python bench/chaos.py --short      # one minute, a dozen faults (the test suite's variant)

Everything it restarts is its own: a private PostgreSQL cluster (initdb into a temporary directory
with the machine's PostgreSQL binaries, on a free port, fsync on), a private ``redis-server``
(no persistence) as broker, channel layer and progress streams, ``--workers`` supervised
``celery worker`` process groups and one supervised ``celery beat``, one daphne, and the sandbox
payment provider (examples/sandbox), which counts what it really did and posts its signed outcome
webhooks to daphne. Nothing else on the machine is touched.

The load (threads of this process, through the public HTTP API, signed webhooks and WebSockets):
refund requests with and without approval (replayed with their Idempotency-Key), an approver
deciding through the approvals API (some decisions sent twice, some after an order change, which
must be refused as stale), supplier assessments (some sources revised during review), chat turns
of the agent ``chaos.chat`` (a tool call, then a stream) on sockets that drop and resume, signed
webhook deliveries with replays, and ``chaos.mixed`` runs (sleeps, waits for events, retries,
``atomic=True`` steps). The workflows are bench/chaos_workflows.py: their bodies count themselves.

Faults at random times, logged with timestamps: SIGKILL of a worker's process group, SIGKILL of
beat, Redis restarted without persistence, PostgreSQL restarted (``pg_ctl -m immediate``), the
provider timing out or failing after it committed a refund, a WebSocket client dropping and
resuming. Recovery after each: for process and server faults, until a canary run started after
the fault completed (a step, a timer only beat's sweeper fires, a step) and every run that was
running at the fault moved on; for a provider fault, until the refund's run finished; for a
dropped socket, until the resumed socket's replay was complete.

After the load stops and the system drains, the checks print a table; the exit status is 1 if any
must-be-0 figure is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # as in bench/engine.py: bench/ would shadow workflows

import httpx  # noqa: E402
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.typing import Origin  # noqa: E402

from bench.harness import Row, percentile, print_table, run_main, say  # noqa: E402
from tests.support import AsgiServer, RedisServer, Worker, free_port, service_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
SECRET = "whsec_" + "Y2hhb3MtY2FtcGFpZ24tc2VjcmV0"  # base64 of "chaos-campaign-secret"
TERMINAL = ("completed", "failed", "terminated")
FAULT_KINDS = (
    "worker_kill",
    "beat_kill",
    "redis_restart",
    "broker_restart",
    "postgres_restart",
    "provider_timeout",
    "provider_error_after_commit",
    "ws_drop",
)
# Shares of the faults of a default run: at least 100 worker kills in 10 minutes at 16 a minute.
WEIGHTS = {
    "worker_kill": 0.70,
    "beat_kill": 0.05,
    "redis_restart": 0.05,
    "broker_restart": 0.0,  # --broker rabbitmq: the shares of Redis's restarts, split between the two
    "postgres_restart": 0.05,
    "provider_timeout": 0.05,
    "provider_error_after_commit": 0.04,
    "ws_drop": 0.06,
}
SHORT_FAULTS = {"worker_kill": 6, **{k: 1 for k in FAULT_KINDS if k not in ("worker_kill", "broker_restart")}}
RECOVERY_TIMEOUT = 180.0
CONSUMER_TIMEOUT = 7200  # seconds: the private RabbitMQ node's, told to the processes as settings expect


# --- arguments -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load and the faults last (default 10)")
    p.add_argument("--faults-per-minute", type=float, default=16.0, help="faults injected per minute (default 16)")
    p.add_argument("--workers", type=int, default=2, help="supervised celery worker process groups (default 2)")
    p.add_argument("--concurrency", type=int, default=2, help="prefork processes per worker (default 2)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a new one, printed)")
    p.add_argument("--drain-timeout", type=float, default=None, help="seconds to wait for the drain (180; short 30)")
    p.add_argument("--short", action="store_true", help="one minute and a dozen faults: the test suite's variant")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (data, logs) at the end")
    p.add_argument(
        "--broker",
        choices=("redis", "rabbitmq"),
        default="redis",
        help="the Celery broker: the private Redis (default) or a private RabbitMQ node (quorum queues, "
        "publisher confirms); Redis stays the channel layer and the streams either way",
    )
    args = p.parse_args(argv)
    if args.short:
        args.minutes = 1.0
    if args.drain_timeout is None:
        args.drain_timeout = 30.0 if args.short else 180.0
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    if args.minutes <= 0 or args.workers < 1 or args.concurrency < 1 or args.faults_per_minute < 0:
        p.error("--minutes, --workers and --concurrency must be positive, --faults-per-minute not negative")
    return args


# --- the private servers -------------------------------------------------------------------------
def postgres_bin() -> Path:
    """The machine's PostgreSQL server binaries: $PG_BIN, Debian's newest, or where pg_ctl leads."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if found:
        return Path(found[-1])
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise RuntimeError("no PostgreSQL server binaries found: set PG_BIN to the directory holding pg_ctl")
    return Path(pg_ctl).resolve().parent


class PrivatePostgres:
    """A cluster of the campaign's own in ``root`` (its to restart), on a free port, fsync on. As
    root, its processes run as the ``postgres`` user (PostgreSQL refuses to run as root)."""

    def __init__(self, root: Path) -> None:
        self.bin = postgres_bin()
        self.dir = root / "pg"
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = free_port()
        self.as_user: list[str] = []
        self.dir.mkdir()
        if os.geteuid() == 0:
            import pwd

            entry = pwd.getpwnam("postgres")
            os.chmod(root, 0o755)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        self.start()

    def _run(self, *cmd: str) -> None:
        done = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=300 "
            "-c shared_buffers=64MB"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )

    def restart(self) -> None:
        """An immediate stop (no shutdown checkpoint: a crash, recovered from the WAL), then a start."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        time.sleep(0.5)
        self.start()

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")
        except RuntimeError:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")


class PrivateRabbitMQ:
    """A RabbitMQ node of the campaign's own (``--broker rabbitmq``): its own node name, ports, data
    and configuration in ``root``, so restarting it disturbs no other user of the machine's broker.
    Its quorum queues and their messages survive a restart, as on a real broker."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "rabbitmq"
        self.port, self.dist_port = free_port(), free_port()
        self.node = f"chaos{os.getpid()}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        for sub in ("home", "mnesia", "log"):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        # A consumer timeout above the engine's longest task (the system checks compare them).
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nconsumer_timeout = {CONSUMER_TIMEOUT * 1000}\n"
        )
        (self.dir / "env.conf").write_text("")  # not the machine's rabbitmq-env.conf (its node name)
        self.start()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> None:
        env = {
            **os.environ,
            "HOME": str(self.dir / "home"),  # its own Erlang cookie
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "env.conf"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        with open(self.dir / "log" / "server.out", "ab") as out:
            self.process = subprocess.Popen(
                [shutil.which("rabbitmq-server", path="/usr/lib/rabbitmq/bin") or "rabbitmq-server"],
                cwd=self.dir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ did not start: see {self.dir / 'log'}")
            time.sleep(0.2)

    def _listening(self) -> bool:
        import socket

        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        """A clean stop (SIGTERM to the node's process group): what a restart of the service does."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


# --- supervised processes ------------------------------------------------------------------------
class Beat:
    """``celery beat`` in a process group of its own (the sweeper, the schedules' tick)."""

    def __init__(self, directory: Path) -> None:
        self.log = open(directory / "beat.log", "ab")  # noqa: SIM115  # closed by the campaign at the end
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "beat",
                "-s",
                str(directory / "beat-schedule"),
                "-l",
                "WARNING",
            ],
            cwd=ROOT,
            env=service_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@dataclass
class Supervised:
    """A process the campaign keeps running, as scripts/supervise.sh would: ``spawn`` starts it
    again one second after it exits. ``killing`` marks an exit the campaign caused."""

    name: str
    spawn: Callable[[], Any]  # returns an object with ``.process`` (a Popen)
    current: Any = None
    killing: bool = False
    exited_at: float | None = None
    restarts: int = 0

    @property
    def process(self) -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = self.current.process
        return process


def last_error(log: str) -> str:
    """The last CRITICAL or ERROR line of a process's log (why it exited), and the log's name."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return f"no log ({log})"
    found = [x for x in lines if " CRITICAL " in x] or [x for x in lines if " ERROR " in x] or lines[-1:]
    return f"{found[-1][:300] if found else 'an empty log'} (log {log})"


class Supervisor:
    def __init__(self) -> None:
        self.items: list[Supervised] = []
        self.lock = threading.Lock()
        self.self_exits: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="supervisor", daemon=True)

    def add(self, name: str, spawn: Callable[[], Any]) -> Supervised:
        item = Supervised(name, spawn, spawn())
        self.items.append(item)
        return item

    def kill(self, item: Supervised) -> None:
        """SIGKILL the item's whole process group (the worker and its prefork children)."""
        with self.lock:
            if item.process.poll() is not None:
                return
            item.killing = True
            try:
                os.killpg(item.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            item.process.wait(timeout=10)

    def loop(self) -> None:
        while not self.stopping.wait(0.2):
            for item in self.items:
                with self.lock:
                    code = item.process.poll()
                    if code is None:
                        continue
                    now = time.monotonic()
                    if item.exited_at is None:
                        item.exited_at = now
                        if not item.killing:
                            why = last_error(item.current.log.name)
                            self.self_exits.append(f"{item.name} exited {code} by itself: {why}")
                            say(f"SUPERVISOR: {item.name} exited {code} by itself ({why}); restarting it")
                    if now - item.exited_at < 1.0:  # scripts/supervise.sh's first delay
                        continue
                    try:
                        item.current = item.spawn()
                    except Exception as exc:  # e.g. a worker that cannot start while PostgreSQL restarts
                        say(f"SUPERVISOR: restarting {item.name} failed: {exc}")
                        item.exited_at = now
                        continue
                    item.killing, item.exited_at = False, None
                    item.restarts += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        for item in self.items:
            if item.process.poll() is None:
                os.killpg(item.process.pid, signal.SIGTERM)
        for item in self.items:
            try:
                item.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(item.process.pid, signal.SIGKILL)
                item.process.wait()


# --- what the drivers saw ------------------------------------------------------------------------
@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)  # "<driver> <status>"
    errors: list[str] = field(default_factory=list)

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def answer(self, driver: str, status: int | str) -> None:
        with self.lock:
            self.answers[f"{driver} {status}"] += 1

    def error(self, message: str) -> None:
        with self.lock:
            if len(self.errors) < 50:
                self.errors.append(message)


LOGS: list[str] = []  # every worker's log file (a restart makes a new one), removed at the end


def new_worker(concurrency: int) -> Worker:
    worker = Worker(concurrency=concurrency, loglevel="WARNING")
    LOGS.append(worker.log.name)
    worker.log.close()  # the process has its own descriptor
    return worker


def db_retry(fn: Callable[[], T], *, timeout: float = 120.0) -> T:
    """Call ``fn`` (an ORM query of this thread), reconnecting while PostgreSQL restarts."""
    from django.db import Error, connection

    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Error:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


class Api:
    """A signed-in HTTP client of the API: retries what a transport error or a 5xx interrupted,
    with the same body and Idempotency-Key, as a careful client would."""

    def __init__(self, world: World, token: str, driver: str) -> None:
        self.world, self.driver = world, driver
        self.client = httpx.Client(base_url=world.daphne.url, headers={"Authorization": f"Token {token}"}, timeout=20)

    def call(
        self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None, patience: float = 90.0
    ) -> httpx.Response | None:
        deadline = time.monotonic() + patience
        while True:
            try:
                response = self.client.request(method, path, json=body, headers=headers)
                self.world.stats.answer(self.driver, response.status_code)
                if response.status_code < 500:
                    return response
            except httpx.TransportError as exc:
                self.world.stats.answer(self.driver, type(exc).__name__)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)


# --- the world -----------------------------------------------------------------------------------
@dataclass
class World:
    args: argparse.Namespace
    rng: random.Random
    root: Path
    pg: PrivatePostgres
    redis: RedisServer
    daphne: AsgiServer
    sandbox: Any  # examples.sandbox.process.SandboxProcess
    supervisor: Supervisor
    workers: list[Supervised]
    beat: Supervised
    tokens: dict[str, str]
    cookie: str
    stats: Stats = field(default_factory=Stats)
    stop: threading.Event = field(default_factory=threading.Event)
    provider_faults: list[tuple[str, float, int]] = field(default_factory=list)  # (fault, at, fault index)
    provider_lock: threading.Lock = field(default_factory=threading.Lock)
    rabbitmq: PrivateRabbitMQ | None = None  # --broker rabbitmq


# --- drivers -------------------------------------------------------------------------------------
def refunds_driver(world: World, faults: FaultLog) -> None:
    """Orders and refund requests: without approval (an order of 80.00, refunds of 30.00, the
    third refused for its balance), with approval (150.00 of 250.00), each request replayed with
    its Idempotency-Key. A provider fault the scheduler asked for is armed on the next small one."""
    from django.contrib.auth.models import User

    from examples.refunds.models import Order
    from examples.refunds.services import order_create

    api = Api(world, world.tokens["customer"], "refunds")
    customer = db_retry(lambda: User.objects.get(username="chaos-customer"))
    rng = random.Random(world.rng.random())
    n = 0
    while not world.stop.is_set():
        n += 1
        big = rng.random() < 0.35
        number = f"C{n}"
        amount = "250.00" if big else "80.00"

        def create(number: str = number, amount: str = amount) -> Order:  # again after a restart: the same order
            found = Order.objects.filter(number=number).first()
            return found or order_create(number=number, customer=customer, amount=amount, items=[{"sku": "x"}])

        order = db_retry(create)
        asks = ["150.00"] if big else ["30.00", "30.00", "30.00"]
        for i, ask in enumerate(asks):
            if world.stop.is_set():
                break
            key = f"refund-{n}-{i}"
            body = {"amount": ask, "reason": "chaos"}
            response = api.call("POST", f"/api/orders/{order.number}/refunds", body, headers={"Idempotency-Key": key})
            if response is None:
                world.stats.error(f"refund {key}: no answer within the patience")
                continue
            world.stats.count(f"refund answers {response.status_code}")
            if response.status_code == 201 and not big:
                arm_provider_fault(world, faults, f"refund:{order.number}:{response.json()['id']}")
            if rng.random() < 0.3:  # a replay: the same request again
                again = api.call("POST", f"/api/orders/{order.number}/refunds", body, headers={"Idempotency-Key": key})
                if again is not None:
                    world.stats.count(f"refund replays {again.status_code}")
        world.stop.wait(rng.uniform(0.5, 1.5))


def arm_provider_fault(world: World, faults: FaultLog, key: str) -> None:
    with world.provider_lock:
        if not world.provider_faults:
            return
        kind, at, index = world.provider_faults.pop(0)
    fault = "timeout=3" if kind == "provider_timeout" else "error-after-commit"
    try:
        world.sandbox.arm(key, fault)
    except Exception as exc:
        world.stats.error(f"arming {fault} on {key}: {exc}")
        return
    faults.note(index, f"armed {fault} on {key}")
    threading.Thread(target=faults.measure_refund, args=(index, key), daemon=True).start()


def approver_driver(world: World) -> None:
    """Decides pending approvals through the API: mostly approves, sometimes rejects, sometimes
    sends the same decision twice; sometimes changes the order first (the decision on the old
    version must be refused as stale) or has the requester revise a supplier's source."""
    from examples.refunds.services import order_change

    api = Api(world, world.tokens["approver"], "approvals")
    requester = Api(world, world.tokens["customer"], "suppliers")
    rng = random.Random(world.rng.random())
    changed: set[str] = set()
    while not world.stop.is_set():
        response = api.call("GET", "/api/approvals?status=pending&page_size=50")
        if response is None or response.status_code != 200:
            world.stop.wait(1)
            continue
        for item in response.json()["results"]:
            if world.stop.is_set():
                break
            subject = item["subject"]
            subject_key = f"{subject['type']}:{subject['id']}"
            if subject_key not in changed and rng.random() < 0.25:
                changed.add(subject_key)
                if subject["type"] == "refunds.order":
                    order_id = int(subject["id"])
                    db_retry(lambda: order_change(order_id=order_id, items=[{"sku": "y", "qty": 2}]))  # noqa: B023
                    world.stats.count("orders changed during review")
                else:
                    requester.call(
                        "POST",
                        f"/api/assessments/{subject['id']}/sources",
                        {"source": "registry", "content": {"rev": rng.random()}},
                    )
                    world.stats.count("sources revised during review")
                stale = api.call(
                    "POST", f"/api/approvals/{item['id']}/decision", {"approve": True, "version": item["version"]}
                )
                if stale is not None:
                    code = stale.json().get("error", {}).get("code", "") if stale.status_code == 409 else ""
                    world.stats.count(f"decisions after a change {stale.status_code} {code}".strip())
                continue
            decision = {"approve": rng.random() < 0.8, "version": item["version"], "note": "chaos"}
            times = 2 if rng.random() < 0.2 else 1
            for _ in range(times):
                answer = api.call("POST", f"/api/approvals/{item['id']}/decision", decision)
                if answer is not None:
                    world.stats.count(f"decisions {answer.status_code}")
        world.stop.wait(rng.uniform(0.5, 1.5))


def suppliers_driver(world: World) -> None:
    api = Api(world, world.tokens["customer"], "suppliers")
    rng = random.Random(world.rng.random())
    n = 0
    while not world.stop.is_set():
        n += 1
        created = api.call(
            "POST",
            "/api/assessments",
            {"supplier_name": f"Supplier {n}", "sources": {"registry": {"n": n}, "bank": {"ok": True}}},
        )
        if created is not None and created.status_code == 201:
            submitted = api.call("POST", f"/api/assessments/{created.json()['id']}/submit", {"input": {"scope": "all"}})
            world.stats.count(f"assessments submitted {submitted.status_code if submitted else 'no answer'}")
        world.stop.wait(rng.uniform(2.0, 4.0))


def webhooks_driver(world: World) -> None:
    """Signed deliveries to the ``chaos-events`` source, 20% of them replays of an earlier event;
    a delivery a 5xx or a transport error interrupted is sent again, as a provider would."""
    from webhooks.verify import sign_standard

    client = httpx.Client(base_url=world.daphne.url, timeout=20)
    rng = random.Random(world.rng.random())
    sent: list[tuple[str, bytes]] = []
    n = 0
    while not world.stop.is_set():
        if sent and rng.random() < 0.2:
            event_id, body = rng.choice(sent[-50:])
        else:
            n += 1
            event_id, body = f"evt_{n}", json.dumps({"type": "chaos.event", "data": {"n": n}}).encode()
            sent.append((event_id, body))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            headers = {
                "Content-Type": "application/json",
                **sign_standard(secret=SECRET, event_id=event_id, timestamp=int(time.time()), body=body),
            }
            try:
                response = client.post("/webhooks/chaos-events/", content=body, headers=headers)
                world.stats.answer("webhooks", response.status_code)
                if response.status_code < 500:
                    break
            except httpx.TransportError as exc:
                world.stats.answer("webhooks", type(exc).__name__)
            time.sleep(0.5)
        world.stop.wait(rng.uniform(0.3, 0.7))


def workflows_driver(world: World) -> None:
    """``chaos.mixed`` runs through the runs API; half of them wait for a ``chaos.go`` event, which
    is sent (through the API too) to most of them a moment later."""
    api = Api(world, world.tokens["operator"], "runs")
    rng = random.Random(world.rng.random())
    to_wake: list[tuple[float, str]] = []
    n = 0
    while not world.stop.is_set():
        n += 1
        payload = {
            "n": n,
            "wait": n % 2 == 0,
            "sleep": round(rng.uniform(0.3, 2.0), 2),
            "slow": round(rng.uniform(0.2, 1.0), 2),
            # Those not woken go on after the wait's timeout: short in the short variant, whose drain is short.
            "wait_timeout": 6 if world.args.short else 20,
        }
        response = api.call(
            "POST", "/api/workflows/chaos.mixed/runs", {"payload": payload}, headers={"Idempotency-Key": f"mixed-{n}"}
        )
        if response is not None and response.status_code in (200, 201) and payload["wait"] and rng.random() < 0.8:
            to_wake.append((time.monotonic() + rng.uniform(1.0, 4.0), response.json()["id"]))
        now = time.monotonic()
        for due, run_id in [w for w in to_wake if w[0] <= now]:
            to_wake.remove((due, run_id))
            api.call("POST", f"/api/runs/{run_id}/events", {"type": "chaos.go", "idempotency_key": "go"})
        world.stop.wait(rng.uniform(0.3, 0.8))


# --- chat clients --------------------------------------------------------------------------------
@dataclass
class TurnSeen:
    seqs: set[int] = field(default_factory=set)
    duplicates: int = 0
    finished: bool = False
    resuming: bool = False  # a resume was sent and its replay_complete has not come yet

    def contiguous(self) -> int:
        """The highest seq up to which every seq from 1 arrived: where a resume continues."""
        n = 0
        while n + 1 in self.seqs:
            n += 1
        return n

    def gaps(self) -> int:
        """Seqs below the highest received that never arrived (counted once the turn is at rest)."""
        return max(self.seqs, default=0) - len(self.seqs)


class ChatClient:
    """One customer's socket on one agent: sends ``go <n>``, reads the turn's chunks, and when the
    socket drops (or is silent too long) reconnects and resumes after the last seq up to which it
    has them all. A resumed socket sends the replay and the live chunks each once, not necessarily
    in seq order (the page orders them by seq): a seq received twice is a duplicate, and a seq
    missing below the highest received, once the turn finished and no replay is pending, a gap."""

    def __init__(self, world: World, name: str) -> None:
        self.world, self.name = world, name
        self.url = f"{world.daphne.ws_url}/ws/agents/chaos.chat/{name}/"
        self.turns: dict[str, TurnSeen] = {}
        self.current: str | None = None
        self.ws: ClientConnection | None = None
        self.drop_now = asyncio.Event()
        self.resumed: asyncio.Future[float] | None = None

    def last(self, turn: str) -> int:
        return self.turns[turn].contiguous()

    def on_chunk(self, frame: dict[str, Any]) -> None:
        turn = self.turns.setdefault(frame["turn"], TurnSeen())
        seq = int(frame["seq"])
        if seq in turn.seqs:
            turn.duplicates += 1
            return
        turn.seqs.add(seq)
        if frame["chunk_type"] == "finish":
            turn.finished = True

    async def session(self) -> None:
        """One socket, until it drops: resume the current turn, then send a message whenever no
        turn of ours is open."""
        ws = await connect(
            self.url,
            origin=Origin(self.world.daphne.url),
            additional_headers={"Cookie": self.world.cookie},
            proxy=None,
            open_timeout=20,
            ping_interval=None,
            max_size=None,
        )
        self.ws = ws
        try:
            if self.current is not None:
                self.turns[self.current].resuming = True
                await ws.send(json.dumps({"type": "resume", "turn": self.current, "after": self.last(self.current)}))
            last_frame = time.monotonic()
            sent_at = 0.0
            while not self.world.stop.is_set() and not self.drop_now.is_set():
                if (self.current is None or self.turns[self.current].finished) and time.monotonic() - sent_at > 5:
                    self.current = None
                    sent_at = time.monotonic()
                    await ws.send(json.dumps({"type": "message", "text": f"go {random.randint(10, 40)}"}))
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    if time.monotonic() - last_frame > 8:
                        self.world.stats.count("chat reconnects after silence")
                        return
                    continue
                last_frame = time.monotonic()
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "chunk":
                    self.on_chunk(frame)
                elif kind == "turn" and self.current is None and frame.get("status") in ("queued", "running"):
                    self.current = str(frame["id"])
                    self.turns.setdefault(self.current, TurnSeen())
                elif (
                    kind == "turn"
                    and self.current is not None
                    and frame.get("id") == self.current
                    and frame.get("status") not in ("queued", "running", "waiting")
                ):
                    self.turns[self.current].finished = True
                elif kind == "replay_complete":
                    self.turns.setdefault(str(frame["turn"]), TurnSeen()).resuming = False
                    if self.resumed is not None and not self.resumed.done():
                        self.resumed.set_result(time.monotonic())
                elif kind == "error":
                    self.world.stats.count("chat error frames")
        finally:
            self.ws = None
            await ws.close()

    async def run(self) -> None:
        while not self.world.stop.is_set():
            self.drop_now.clear()
            try:
                await self.session()
            except (ConnectionClosed, OSError, TimeoutError) as exc:
                self.world.stats.count(f"chat sockets lost ({type(exc).__name__})")
            except Exception as exc:
                self.world.stats.error(f"chat client {self.name}: {type(exc).__name__}: {exc}")
            if not self.world.stop.is_set():
                await asyncio.sleep(0.3)


class Fleet:
    """The chat clients, on an asyncio loop in a thread of their own."""

    def __init__(self, world: World, n: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.clients = [ChatClient(world, f"c{i}") for i in range(n)]
        self.thread = threading.Thread(target=self.main, name="chat", daemon=True)

    def main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.gather(*(c.run() for c in self.clients)))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def drop_one(self, rng: random.Random) -> float | None:
        """Close one client's socket mid-turn; seconds until its resumed socket replayed, or None."""

        async def drop() -> float | None:
            candidates = [c for c in self.clients if c.ws is not None and c.current is not None] or [
                c for c in self.clients if c.ws is not None
            ]
            if not candidates:
                return None
            client = rng.choice(candidates)
            t0 = time.monotonic()
            client.resumed = self.loop.create_future()
            client.drop_now.set()
            if client.ws is not None:
                await client.ws.close()
            try:
                if client.current is None:  # nothing to resume: the next socket's first frame will do
                    return time.monotonic() - t0
                done = await asyncio.wait_for(client.resumed, timeout=60)
                return done - t0
            except TimeoutError:
                return None

        return self.call(drop(), timeout=90)


# --- faults --------------------------------------------------------------------------------------
@dataclass
class Fault:
    index: int
    kind: str
    at: float  # time.monotonic()
    wall: str
    notes: list[str] = field(default_factory=list)
    recovery: float | None = None
    measured: bool = False


class FaultLog:
    def __init__(self, world: World) -> None:
        self.world = world
        self.faults: list[Fault] = []
        self.lock = threading.Lock()

    def add(self, kind: str) -> Fault:
        with self.lock:
            fault = Fault(len(self.faults), kind, time.monotonic(), time.strftime("%H:%M:%S"))
            self.faults.append(fault)
        return fault

    def note(self, index: int, text: str) -> None:
        fault = self.faults[index]
        fault.notes.append(text)
        say(f"fault #{index} {fault.kind}: {text}")

    def done(self, fault: Fault, seconds: float | None) -> None:
        fault.recovery, fault.measured = seconds, True
        shown = "not within the timeout" if seconds is None else f"{seconds:.2f} s"
        say(f"fault #{fault.index} {fault.kind}: recovered {shown}")

    # Recovery of a process or server fault: a canary started after it completed, and every run that
    # was running when it struck moved on (finished, waits, sleeps, or stored another step).
    def measure_system(self, fault: Fault, in_flight: dict[str, int]) -> None:
        from workflows.models import StepResult, WorkflowRun
        from workflows.services import run_start

        try:
            run, _ = db_retry(lambda: run_start(workflow="chaos.canary", payload={"fault": fault.index}))
            deadline = fault.at + RECOVERY_TIMEOUT
            pending = dict(in_flight)
            canary_done = False
            while time.monotonic() < deadline:
                if not canary_done:
                    canary_done = db_retry(lambda: WorkflowRun.objects.filter(pk=run.pk, status="completed").exists())
                if pending:
                    rows = db_retry(
                        lambda: list(WorkflowRun.objects.filter(pk__in=list(pending)).values("id", "status"))
                    )
                    for row in rows:
                        key = str(row["id"])
                        if row["status"] != "running" and row["status"] != "queued":
                            pending.pop(key, None)
                    if pending:
                        counts = db_retry(
                            lambda: Counter(
                                str(r)
                                for r in StepResult.objects.filter(
                                    run_id__in=list(pending), status="completed"
                                ).values_list("run_id", flat=True)
                            )
                        )
                        for key, before in list(pending.items()):
                            if counts[key] > before:
                                pending.pop(key)
                if canary_done and not pending:
                    self.done(fault, time.monotonic() - fault.at)
                    return
                time.sleep(0.2)
            self.done(fault, None)
        except Exception as exc:
            self.world.stats.error(f"measuring fault #{fault.index}: {type(exc).__name__}: {exc}")
            self.done(fault, None)
        finally:
            from django.db import connection

            connection.close()

    def measure_refund(self, index: int, key: str) -> None:
        """A provider fault: from arming it until the refund's run finished."""
        from examples.refunds.models import RefundRequest

        fault = self.faults[index]
        request_id = int(key.rsplit(":", 1)[1])
        t0 = time.monotonic()
        try:
            while time.monotonic() < t0 + RECOVERY_TIMEOUT:
                status = db_retry(
                    lambda: RefundRequest.objects.filter(pk=request_id).values_list("run__status", flat=True).first()
                )
                if status in TERMINAL:
                    self.done(fault, time.monotonic() - t0)
                    return
                time.sleep(0.2)
            self.done(fault, None)
        finally:
            from django.db import connection

            connection.close()


def in_flight_runs() -> dict[str, int]:
    """The runs running now, with how many steps each has completed."""
    from django.db.models import Count, Q

    from workflows.models import WorkflowRun

    rows = WorkflowRun.objects.filter(status="running").annotate(
        done=Count("steps", filter=Q(steps__status="completed"))
    )
    return {str(r.id): int(r.done) for r in rows}


def schedule_faults(args: argparse.Namespace, rng: random.Random, seconds: float) -> list[tuple[float, str]]:
    """(offset in seconds, kind), sorted: each kind its share of the total, at uniform random times
    after a settling start and before the last few seconds."""
    if args.short:
        counts = dict(SHORT_FAULTS)  # a dozen
    else:
        total = round(args.faults_per_minute * args.minutes)
        counts = {kind: int(total * share) for kind, share in WEIGHTS.items()}
        counts["worker_kill"] += total - sum(counts.values())
    if args.broker == "rabbitmq":
        # Redis is then the channel layer and the streams, RabbitMQ the broker: each is restarted.
        counts["broker_restart"] = max(1, counts["redis_restart"] // 2)
        counts["worker_kill"] -= counts["broker_restart"] if not args.short else 0
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    start, end = min(8.0, seconds * 0.1), seconds - min(5.0, seconds * 0.1)
    times = sorted(rng.uniform(start, end) for _ in kinds)
    rng.shuffle(kinds)
    return list(zip(times, kinds, strict=True))


def fault_scheduler(world: World, faults: FaultLog, fleet: Fleet, plan: list[tuple[float, str]], t0: float) -> None:
    rng = random.Random(world.rng.random())
    for offset, kind in plan:
        if world.stop.wait(max(0.0, t0 + offset - time.monotonic())):
            return
        try:
            inject(world, faults, fleet, kind, rng)
        except Exception as exc:
            world.stats.error(f"injecting {kind}: {type(exc).__name__}: {exc}")
            say(f"injecting {kind} failed: {exc}")


def inject(world: World, faults: FaultLog, fleet: Fleet, kind: str, rng: random.Random) -> None:
    if kind in ("provider_timeout", "provider_error_after_commit"):
        fault = faults.add(kind)
        say(f"fault #{fault.index} {kind}: waiting for the next refund without approval")
        with world.provider_lock:
            world.provider_faults.append((kind, fault.at, fault.index))
        return
    if kind == "ws_drop":
        fault = faults.add(kind)
        say(f"fault #{fault.index} {kind}")

        def measure() -> None:
            faults.done(fault, fleet.drop_one(rng))

        threading.Thread(target=measure, daemon=True).start()
        return
    in_flight = db_retry(in_flight_runs, timeout=30)
    fault = faults.add(kind)
    if kind == "worker_kill":
        target = rng.choice(world.workers)
        world.supervisor.kill(target)
        faults.note(
            fault.index, f"SIGKILL {target.name} (process group {target.process.pid}); {len(in_flight)} runs running"
        )
    elif kind == "beat_kill":
        world.supervisor.kill(world.beat)
        faults.note(fault.index, "SIGKILL beat")
    elif kind == "redis_restart":
        world.redis.shutdown()
        time.sleep(rng.uniform(0.5, 2.0))
        world.redis.start()
        faults.note(fault.index, "Redis restarted without persistence (queues, streams, channel layer lost)")
    elif kind == "broker_restart":
        assert world.rabbitmq is not None
        world.rabbitmq.restart()
        faults.note(fault.index, "RabbitMQ restarted (connections cut; its quorum queues kept)")
    elif kind == "postgres_restart":
        world.pg.restart()
        faults.note(fault.index, "PostgreSQL restarted (immediate stop, crash recovery)")
    threading.Thread(target=faults.measure_system, args=(fault, in_flight), daemon=True).start()


# --- checks --------------------------------------------------------------------------------------
@dataclass
class Figures:
    rows: list[Row] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def must_be_zero(self, figure: str, value: int, how: str = "") -> None:
        self.rows.append(Row(figure, f"{value:,}", "0", value == 0))
        if value:
            self.failed.append(f"{figure}: {value}{' (' + how + ')' if how else ''}")

    def info(self, figure: str, value: str, target: str = "", ok: bool | None = None) -> None:
        self.rows.append(Row(figure, value, target, ok))


def waiting_for_person(run_ids: list[Any]) -> set[str]:
    from approvals.models import ApprovalRequest

    return {
        str(r)
        for r in ApprovalRequest.objects.filter(run_id__in=run_ids, status="pending").values_list("run_id", flat=True)
    }


def unfinished() -> tuple[list[Any], set[str]]:
    """Runs not finished, and those of them waiting for a person (a pending approval)."""
    from workflows.models import WorkflowRun

    open_runs = list(WorkflowRun.objects.exclude(status__in=TERMINAL).values_list("id", flat=True))
    return open_runs, waiting_for_person(open_runs)


def drain(world: World, timeout: float) -> float:
    """Until every run has finished or waits for a person, and every turn has ended."""
    from agents.models import TURN_ENDED, Turn

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        open_runs, people = db_retry(unfinished)
        turns_open = db_retry(lambda: Turn.objects.exclude(status__in=TURN_ENDED).exists())
        if len(open_runs) == len(people) and not turns_open:
            break
        time.sleep(0.5)
    return time.monotonic() - t0


def check(world: World, faults: FaultLog, fleet: Fleet) -> Figures:
    from django.db import connection
    from django.db.models import Count

    from agents.models import TURN_ENDED, Chunk, Turn
    from approvals.models import DecisionLog
    from examples.refunds.models import Order
    from workflows.models import WorkflowRun

    fig = Figures()
    by_status = Counter(dict(WorkflowRun.objects.values_list("status").annotate(n=Count("id"))))
    started = sum(by_status.values())
    open_runs, people = unfinished()
    stuck_runs = [str(r) for r in open_runs if str(r) not in people]
    turns_open = list(Turn.objects.exclude(status__in=TURN_ENDED).values_list("id", flat=True))
    fig.info("runs started", f"{started:,}")
    fig.info(
        "  finished (completed / failed / terminated)",
        f"{by_status['completed']:,} / {by_status['failed']:,} / {by_status['terminated']:,}",
    )
    fig.info("  waiting for a person (expected)", f"{len(people):,}")
    fig.must_be_zero(
        "  stuck (neither finished nor waiting for a person)",
        len(stuck_runs) + len(turns_open),
        f"runs {stuck_runs[:5]}, turns {[str(t) for t in turns_open[:5]]}",
    )
    failed = Counter(WorkflowRun.objects.filter(status="failed").values_list("workflow", flat=True))
    if failed:
        fig.info("  failed runs by workflow", ", ".join(f"{k} {v}" for k, v in sorted(failed.items())))

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(*) FILTER (WHERE after_completed) FROM chaos_exec")
        executions, late = cursor.fetchone() or (0, 0)
        cursor.execute("""
            SELECT count(*) FROM (SELECT run_id, attempt, step FROM chaos_exec
            GROUP BY run_id, attempt, step HAVING count(*) > 1) again""")
        rerun = (cursor.fetchone() or (0,))[0]
        cursor.execute("""
            SELECT count(*) FILTER (WHERE n > 1), count(*) FILTER (WHERE n = 0), count(*) FROM (
                SELECT (SELECT count(*) FROM chaos_effect e
                        WHERE e.run_id = s.run_id AND e.attempt = s.attempt AND e.step = s.name) AS n
                FROM workflows_stepresult s
                WHERE s.status = 'completed' AND (s.name IN ('write', 'finish', 'apply') OR s.name LIKE 'tool %%')
                  AND EXISTS (SELECT 1 FROM chaos_exec x WHERE x.run_id = s.run_id AND x.step = s.name)
            ) atomic_steps""")
        doubled, missing, atomic_steps = cursor.fetchone() or (0, 0, 0)
        cursor.execute("""
            SELECT count(*) FROM (SELECT run_id, attempt, step FROM chaos_effect
            GROUP BY run_id, attempt, step HAVING count(*) > 1) twice""")
        effects_twice = (cursor.fetchone() or (0,))[0]
    fig.info("step bodies executed (counted by the bodies)", f"{executions:,}")
    fig.info("  steps whose body ran again before its result was stored", f"{rerun:,}")
    fig.must_be_zero(
        "completed step bodies executed twice",
        int(late),
        "bodies that began after their step's completed result was committed",
    )
    fig.must_be_zero("atomic steps with their writes twice", int(max(doubled, effects_twice)))
    fig.must_be_zero(f"atomic steps completed without their writes (of {atomic_steps:,})", int(missing))

    status, body = world.sandbox.request("GET", "/v1/refunds", timeout=30)
    refunds = list(body["refunds"]) if status == 200 else []
    per_key = Counter(str(r["key"]) for r in refunds)
    fig.info("refunds at the provider", f"{len(refunds):,}")
    fig.must_be_zero("provider: effects per operation key above 1", sum(1 for n in per_key.values() if n > 1))
    from decimal import Decimal

    paid: defaultdict[str, Decimal] = defaultdict(Decimal)
    for r in refunds:
        if r.get("status") in ("succeeded", "pending"):
            paid[str(r["order"])] += Decimal(str(r["amount"]))
    amounts = {o.number: o.amount for o in Order.objects.filter(number__in=list(paid))}
    over = [number for number, total in paid.items() if total > amounts.get(number, Decimal(0))]
    fig.must_be_zero("provider: orders refunded above their amount", len(over), f"orders {over[:5]}")
    stats = world.sandbox.stats()
    fig.info("  provider requests by outcome", ", ".join(f"{k} {v}" for k, v in sorted(stats["requests"].items())))

    decided = (
        DecisionLog.objects.filter(action__in=("approve", "reject"), result="accepted")
        .values("request_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    fig.info(
        "approval decisions logged (accepted / repeated / refused)",
        " / ".join(
            f"{DecisionLog.objects.filter(action__in=('approve', 'reject'), result=r).count():,}"
            for r in ("accepted", "repeated", "refused")
        ),
    )
    fig.must_be_zero("approvals decided twice", decided)

    gaps = dups = 0
    turns = 0
    for row in Chunk.objects.values("turn_id").annotate(n=Count("id"), distinct=Count("seq", distinct=True)):
        turns += 1
        seqs = Chunk.objects.filter(turn_id=row["turn_id"]).order_by("seq").values_list("seq", flat=True)
        top = seqs.last() or 0
        dups += row["n"] - row["distinct"]
        gaps += int(top != row["distinct"])
    fig.info(
        "chat turns streamed (stored)",
        f"{turns:,}; by status: "
        + ", ".join(f"{k} {v}" for k, v in sorted(Counter(Turn.objects.values_list("status", flat=True)).items())),
    )
    fig.must_be_zero("chat streams with a gap or duplicate seq (stored)", gaps + dups)
    client_gaps = sum(t.gaps() for c in fleet.clients for t in c.turns.values() if t.finished and not t.resuming)
    client_dups = sum(t.duplicates for c in fleet.clients for t in c.turns.values())
    received = sum(len(t.seqs) for c in fleet.clients for t in c.turns.values())
    fig.info("chat chunks received by the clients", f"{received:,} in {sum(len(c.turns) for c in fleet.clients)} turns")
    fig.must_be_zero(
        "chat streams with a gap or duplicate seq (received)",
        client_gaps + client_dups,
        f"{client_gaps} gaps, {client_dups} duplicates",
    )

    keys = Counter(WorkflowRun.objects.filter(workflow="chaos.webhook").values_list("idempotency_key", flat=True))
    fig.info(
        "webhook events with an effect (answers: "
        + ", ".join(f"{k.split()[1]} {v}" for k, v in sorted(world.stats.answers.items()) if k.startswith("webhooks"))
        + ")",
        f"{len(keys):,}",
    )
    fig.must_be_zero("webhook events with two effects", sum(1 for n in keys.values() if n > 1))

    kinds = Counter(f.kind for f in faults.faults)
    fig.info("faults injected", f"{len(faults.faults):,}")
    for kind in FAULT_KINDS:
        times = [f.recovery for f in faults.faults if f.kind == kind and f.recovery is not None]
        unrecovered = sum(1 for f in faults.faults if f.kind == kind and f.measured and f.recovery is None)
        shown = f"{percentile(times, 0.5):.2f} / {percentile(times, 0.99):.2f} s" if times else "-"
        fig.info(
            f"  {kind} ({kinds[kind]}): recovery p50 / p99", shown + (f", {unrecovered} not" if unrecovered else "")
        )
    unrecovered_all = sum(1 for f in faults.faults if f.measured and f.recovery is None)
    fig.info("  faults not recovered within 180 s", f"{unrecovered_all}", "0", unrecovered_all == 0)
    self_exits = len(world.supervisor.self_exits)
    fig.info("processes that exited by themselves", f"{self_exits}", "0 (goal)", self_exits == 0)
    return fig


# --- main ----------------------------------------------------------------------------------------
def configure_environment(pg: PrivatePostgres, redis: RedisServer, root: Path, *, broker: str) -> None:
    tag = f"chaos-{os.getpid()}"
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": f"{pg.url}/chaos",
            "REDIS_URL": redis.url,
            "CELERY_BROKER_URL": broker,
            "RABBITMQ_CONSUMER_TIMEOUT": str(CONSUMER_TIMEOUT),
            "WORKFLOWS_QUEUE": tag,
            "CHANNELS_PREFIX": f"asgi-{tag}",
            "WORKFLOWS_MODULES": "bench.chaos_workflows",
            "AGENTS_MODULES": "bench.chaos_workflows",
            "INSTALL_EXAMPLES": "1",
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "chaos-" + os.urandom(32).hex(),
            "SANDBOX_WEBHOOK_SECRET": SECRET,
            "WEBHOOK_SOURCES_JSON": json.dumps(
                {
                    "sandbox-payments": {
                        "scheme": "standard",
                        "secrets": [SECRET],
                        "action": {"type": "operation_outcome", "system": "payments"},
                    },
                    "chaos-events": {
                        "scheme": "standard",
                        "secrets": [SECRET],
                        "action": {"type": "workflow", "workflow": "chaos.webhook", "payload_from": "data"},
                    },
                }
            ),
            # Recovery within seconds: short leases, a sweep a second, a lost enqueue sent again after 5 s.
            "WORKFLOWS_LEASE_SECONDS": "5",
            "WORKFLOWS_ENQUEUE_GRACE_SECONDS": "5",
            "WORKFLOWS_SWEEP_INTERVAL": "1",
            # A run may be hit by many of the hundred kills: it must not be failed as poison for that.
            "WORKFLOWS_MAX_RECOVERY_ATTEMPTS": "50",
            "AGENTS_MAX_RECOVERIES": "20",
            "WORKFLOWS_MAX_ACTIVE_RUNS_PER_OWNER": "0",
            "AGENTS_MAX_OPEN_TURNS_PER_USER": "0",
            "AGENTS_MAX_QUEUED_TURNS": "0",
            "REFUND_MAX_OPEN_REQUESTS": "0",
            # A provider timeout is a 3 s hold: the ledger gives up at 2 s and looks the key up after.
            "LEDGER_CONNECT_TIMEOUT": "2",
            "LEDGER_READ_TIMEOUT": "2",
            "LEDGER_STALE_SUBMITTED_SECONDS": "10",
            "LEDGER_PROVIDER_GRACE_SECONDS": "5",
        }
    )
    os.environ.pop("DEBUG", None)
    # Unset, not empty: prometheus-client takes an empty value as set, and writes its files to the cwd.
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)


def setup_people() -> tuple[dict[str, str], str]:
    """The customer (orders, assessments, chat), the approver (both approver groups), an operator
    (runs): their API tokens, and the customer's session cookie for the chat sockets."""
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from accounts.services import account_ensure

    customer = User.objects.create_user("chaos-customer", password="x")
    approver = User.objects.create_user("chaos-approver", password="x")
    operator = User.objects.create_user("chaos-operator", password="x")
    for name in ("refund-approvers", "supplier-reviewers"):
        Group.objects.get_or_create(name=name)[0].user_set.add(approver)
    account_ensure(slug="chaos", name="Chaos", members=[customer])
    tokens = {u.username.split("-")[1]: Token.objects.create(user=u).key for u in (customer, approver, operator)}
    client = Client()
    client.force_login(customer)
    return tokens, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="chaos-"))
    say(
        f"seed {args.seed}; {args.minutes:g} min, {args.workers} workers x {args.concurrency}, broker {args.broker}; "
        f"directory {root}"
    )
    started: list[Callable[[], None]] = []  # undone in reverse order, whatever happens
    ok = False
    fig: Figures | None = None
    try:
        pg = PrivatePostgres(root)
        started.append(pg.stop)
        redis = RedisServer()
        started.append(redis.stop)
        rabbitmq: PrivateRabbitMQ | None = None
        if args.broker == "rabbitmq":
            rabbitmq = PrivateRabbitMQ(root)
            started.append(rabbitmq.stop)
        configure_environment(pg, redis, root, broker=rabbitmq.url if rabbitmq else redis.url)
        import psycopg

        with psycopg.connect(f"{pg.url}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from bench.chaos_workflows import TABLES
        from examples.sandbox.process import SandboxProcess

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(TABLES)
        tokens, cookie = setup_people()
        daphne = AsgiServer()
        started.append(lambda: Path(daphne.log.name).unlink(missing_ok=True))
        started.append(daphne.stop)
        sandbox = SandboxProcess(
            root / "sandbox.sqlite3",
            webhook_url=f"{daphne.url}/webhooks/sandbox-payments/",
            webhook_secret=SECRET,
            args=("--timeout-seconds", "3"),
        )
        sandbox.start()

        def stop_sandbox() -> None:
            sandbox.stop()

        started.append(stop_sandbox)
        os.environ["SANDBOX_PAYMENTS_URL"] = sandbox.url
        supervisor = Supervisor()
        started.append(supervisor.stop)
        workers = [supervisor.add(f"worker-{i}", lambda: new_worker(args.concurrency)) for i in range(args.workers)]
        beat = supervisor.add("beat", lambda: Beat(root))
        supervisor.thread.start()
        world = World(args, rng, root, pg, redis, daphne, sandbox, supervisor, workers, beat, tokens, cookie)
        world.rabbitmq = rabbitmq
        faults = FaultLog(world)
        fleet = Fleet(world, 3)
        fleet.thread.start()

        seconds = args.minutes * 60
        plan = schedule_faults(args, rng, seconds)
        say(f"load for {seconds:.0f} s with {len(plan)} faults")
        t0 = time.monotonic()
        drivers = [
            threading.Thread(target=refunds_driver, args=(world, faults), name="refunds", daemon=True),
            threading.Thread(target=approver_driver, args=(world,), name="approver", daemon=True),
            threading.Thread(target=suppliers_driver, args=(world,), name="suppliers", daemon=True),
            threading.Thread(target=webhooks_driver, args=(world,), name="webhooks", daemon=True),
            threading.Thread(target=workflows_driver, args=(world,), name="workflows", daemon=True),
            threading.Thread(target=fault_scheduler, args=(world, faults, fleet, plan, t0), name="faults", daemon=True),
        ]
        for d in drivers:
            d.start()
        world.stop.wait(seconds)
        world.stop.set()
        say("load stopped; draining")
        for d in drivers:
            d.join(timeout=120)
        fleet.thread.join(timeout=30)
        deadline = time.monotonic() + 60
        while (
            any(
                not f.measured
                for f in faults.faults
                if f.kind not in ("provider_timeout", "provider_error_after_commit") or f.notes
            )
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        drained = drain(world, args.drain_timeout)
        say(f"drained in {drained:.1f} s")
        fig = check(world, faults, fleet)
        fig.info("drain after the load stopped", f"{drained:.1f} s")
        print(
            f"seed {args.seed}; {args.minutes:g} minutes; {args.workers} workers x {args.concurrency}; "
            f"load average {os.getloadavg()[0]:.2f} at the end"
        )
        print("\nfaults:")
        for f in faults.faults:
            shown = "-" if f.recovery is None else f"{f.recovery:.2f} s"
            print(f"  {f.wall} #{f.index:<4} {f.kind:<28} recovered {shown:>9}  {'; '.join(f.notes)}")
        if supervisor.self_exits:
            print("\nprocesses that exited by themselves (the supervisor started them again):")
            for line in supervisor.self_exits:
                print(f"  {line}")
        if world.stats.errors:
            print("\ndriver errors (first 50):")
            for e in world.stats.errors:
                print(f"  {e}")
        print("\nanswers:", ", ".join(f"{k} {v}" for k, v in sorted(world.stats.answers.items())))
        print("counts:", ", ".join(f"{k} {v}" for k, v in sorted(world.stats.counts.items())))
        print_table(fig.rows)
        print(f"""
Definitions: a step body counts itself at its start in chaos_exec, on an autocommit connection of its
own (outside the step's transaction), with whether its step's completed result was already committed
then; "completed step bodies executed twice" counts the bodies that began after it was: the engine's
promise. A body that ran again because its try's result was never stored (its worker was killed
first) is allowed and counted apart. Atomic steps write one chaos_effect row in their transaction:
more than one, or none for a completed step, is a broken promise. Stuck: a run neither finished nor
waiting at a pending approval, or a chat turn not ended, {args.drain_timeout:g} s after the load stopped.""")
        ok = not fig.failed
        if fig.failed:
            print("\nMUST-BE-0 FIGURES NOT 0:\n  " + "\n  ".join(fig.failed))
        return 0 if ok else 1
    finally:
        for undo in reversed(started):
            try:
                undo()
            except Exception as exc:
                say(f"clean-up step failed: {type(exc).__name__}: {exc}")
        if args.keep or not ok:
            logs = root / "worker-logs"
            logs.mkdir(exist_ok=True)
            for name in LOGS:
                if Path(name).exists():
                    shutil.move(name, logs / Path(name).name)
            say(f"kept {root} (data and logs)")
        else:
            for name in LOGS:
                Path(name).unlink(missing_ok=True)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
