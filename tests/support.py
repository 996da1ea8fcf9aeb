"""Real processes for tests: Celery workers and an ASGI server on the test database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote
from uuid import UUID, uuid4

from django.db import connection

from config.broker import is_amqp

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

    from workflows.models import WorkflowRun

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def database_url(settings_dict: dict[str, Any], name: str | None = None) -> str:
    """A ``DATABASE_URL`` for a connection's settings (another database of that server by ``name``)."""
    # Quoted: a socket directory as the host (/var/run/postgresql) or a password with an @ in it
    # would otherwise be read as part of the path or the host.
    user = quote(settings_dict["USER"] or "postgres", safe="")
    if settings_dict["PASSWORD"]:
        user += ":" + quote(settings_dict["PASSWORD"], safe="")
    host = quote(settings_dict["HOST"] or "127.0.0.1", safe="")
    return f"postgres://{user}@{host}:{settings_dict['PORT'] or 5432}/{name or settings_dict['NAME']}"


def service_env(**overrides: str) -> dict[str, str]:
    """The test process's environment, pointed at the test database pytest-django created."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url(connection.settings_dict)
    env["PYTHONPATH"] = str(ROOT)
    env.update(overrides)
    return env


def wait_for(predicate: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


class Worker:
    """A real ``celery worker`` process group on the test queue.

    ``loglevel`` above INFO keeps Celery's two lines per task out (a benchmark's plain-Celery
    baseline would pay for them on every task); the worker then logs no "ready." line to wait for,
    so the caller's first task is what shows it up."""

    def __init__(
        self,
        *,
        concurrency: int = 2,
        beat: bool = False,
        pool: str = "prefork",
        queue: str | None = None,
        loglevel: str = "INFO",
        **env: str,
    ) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)
        queue = queue or os.environ["WORKFLOWS_QUEUE"]
        env["WORKFLOWS_QUEUE"] = queue
        self.queue = queue
        # The broker: CELERY_BROKER_URL in ``env`` (amqp://... for RabbitMQ), else the test process's.
        self.broker_url = env.get("CELERY_BROKER_URL") or os.environ.get("CELERY_BROKER_URL") or ""
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            f"{queue},{queue}-io",
            "-n",
            f"{queue}-{time.monotonic_ns()}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            loglevel,
        ]
        if beat:
            self.schedule = tempfile.mktemp(prefix="beat-")
            cmd += ["-B", "-s", self.schedule]
        self.process = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=service_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if loglevel.upper() in ("DEBUG", "INFO"):  # the levels that log "ready."
            wait_for(
                lambda: b"ready." in Path(self.log.name).read_bytes() or self.process.poll() is not None,
                timeout=60,
                what="the worker to start",
            )
        if self.process.poll() is not None:
            raise RuntimeError(f"worker exited:\n{self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker and its children die mid-task."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if is_amqp(self.broker_url):
            # RabbitMQ keeps a durable queue for ever: each test's own queues would pile up. The
            # last of a queue's workers to stop deletes it (one another worker still consumes from
            # is left to that one).
            delete_amqp_queues(self.broker_url, self.queue, f"{self.queue}-io", unless_consumed=True)


def delete_amqp_queues(url: str, *names: str, unless_consumed: bool = False) -> None:
    """Delete the queues ``names`` from the RabbitMQ broker at ``url``, with what they hold; with
    ``unless_consumed``, not one a consumer still reads (quorum queues refuse ``if_unused``, so the
    consumers are counted first). A queue that does not exist is no error."""
    from kombu.connection import Connection

    for name in names:
        with Connection(url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]  # kombu: no annotations
            try:
                _, _, consumers = conn.default_channel.queue_declare(name, passive=True)
                if not (unless_consumed and consumers):
                    conn.default_channel.queue_delete(name)
            except conn.channel_errors:  # NOT_FOUND: nothing to delete
                pass


@contextmanager
def own_redis_prefix(settings: Any, setting: str, stem: str) -> Iterator[str]:
    """Point the key prefix ``setting`` at a prefix of this test's own (``<stem>-<random>``), then
    delete its keys from the Redis the settings named at the start (a test may point REDIS_URL
    elsewhere): counts the suite's processes and tests would otherwise share, all from 127.0.0.1."""
    import redis

    prefix, url = f"{stem}-{uuid4().hex[:8]}", settings.REDIS_URL
    setattr(settings, setting, prefix)
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)


@contextmanager
def use_broker(url: str) -> Iterator[None]:
    """This test process sends its Celery messages (``wf.start``, the sweeper it calls) to the broker
    at ``url``, configured as config/settings.py configures a process started with
    ``CELERY_BROKER_URL=url``: a Celery app of its own is current in this thread meanwhile."""
    from celery import Celery, current_app
    from django.conf import settings

    from config.broker import broker_config

    previous = current_app._get_current_object()
    app = Celery("config", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    timeout = settings.BROKER_ACK_TIMEOUT
    broker = broker_config(url, visibility_timeout=timeout, consumer_timeout=timeout)
    app.conf.update(**broker.celery_settings())
    app.set_current()
    try:
        yield
    finally:
        # Its connections stay open in kombu's pools, which are shared by URL: the next test on
        # the same broker takes them again.
        previous.set_current()


class RedisServer:
    """A private ``redis-server`` on a free port, keeping nothing on disk: a broker a test may
    restart (``restart``) without disturbing the machine's shared Redis."""

    def __init__(self) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="redis-", suffix=".log", delete=False)
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._answers, timeout=10, what=f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())
        except redis.ConnectionError:
            return False

    def shutdown(self) -> None:
        """``SHUTDOWN NOSAVE``: Redis exits and what it held (queues, unacknowledged messages) is gone."""
        import redis

        if self.process is None:
            return
        try:
            redis.Redis(port=self.port, socket_connect_timeout=1).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # it answers the shutdown by closing the connection
        self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.shutdown()
        self.start()

    def stop(self) -> None:
        """Shut down for good, its log closed (kept on disk with the run's other logs)."""
        self.shutdown()
        self.log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AsgiServer:
    """A real daphne process serving the project on the test database."""

    def __init__(self, **env: str) -> None:
        self.port = free_port()
        # Its database connections carry this name (libpq's PGAPPNAME): stop() waits for them to go.
        self.app_name = env.setdefault("PGAPPNAME", f"daphne-{self.port}")
        self.log = tempfile.NamedTemporaryFile(prefix="daphne-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=ROOT,
            env=service_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._listening, timeout=30, what="daphne to listen")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"daphne exited:\n{Path(self.log.name).read_text()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        # Its pool's connections end a moment after the process: the test database is dropped next.
        wait_for(lambda: not self._connections(), timeout=10, what="daphne's database connections to end")

    def _connections(self) -> int:
        """Counted from a thread of its own: stop() is also called where an event loop runs (a
        browser test's), and Django refuses a query there."""

        def count() -> int:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [self.app_name])
                    row = cursor.fetchone()
                return int(row[0]) if row else 0
            finally:
                connection.close()  # this thread's own connection, or the test database's drop waits for it

        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(count).result()


def websocket(url: str, *, origin: str | None, cookie: str | None = None, timeout: float = 45.0) -> ClientConnection:
    """A test's WebSocket client, opened as a browser at ``origin`` with the session ``cookie``
    would open it, that keeps every frame until the test reads it or closes the socket.

    websockets stops reading a socket that has more than 16 frames unread (``max_queue``): a test
    that closed one with an answer streaming into it waited ten seconds (``close_timeout``) for a
    closing frame it no longer read, then dropped the connection. Unbounded, the closing frame is
    read, however much came before it."""
    from websockets.sync.client import connect
    from websockets.typing import Origin

    headers = {"Cookie": cookie} if cookie else {}
    return connect(
        url,
        origin=Origin(origin) if origin is not None else None,
        additional_headers=headers,
        proxy=None,
        open_timeout=timeout,
        max_queue=None,
    )


@contextmanager
def serving(django_db_blocker: Any, **env: str) -> Iterator[AsgiServer]:
    """An AsgiServer with ``env`` for a fixture's life (``with serving(django_db_blocker, ...) as
    server: yield server``), stopped with the database unblocked: stop() waits for its connections
    to end, and a module or session fixture's teardown runs with the database blocked."""
    server = AsgiServer(**env)
    try:
        yield server
    finally:
        with django_db_blocker.unblock():
            server.stop()


def wait_for_status(run_id: UUID | str, *statuses: str, timeout: float = 30.0) -> WorkflowRun:
    """Poll the database until the run reaches one of ``statuses``; return the run."""
    from workflows.models import WorkflowRun

    def reached() -> WorkflowRun | None:
        run = WorkflowRun.objects.get(pk=run_id)
        return run if run.status in statuses else None

    try:
        return wait_for(reached, timeout=timeout, what=f"run {run_id} to be {'/'.join(statuses)}")
    except AssertionError:
        run = WorkflowRun.objects.get(pk=run_id)
        raise AssertionError(
            f"run {run_id} is {run.status} (error {run.error}), not {'/'.join(statuses)} after {timeout}s"
        ) from None


def wait_for_terminal(run_id: UUID | str, timeout: float = 30.0) -> WorkflowRun:
    return wait_for_status(run_id, "completed", "failed", "terminated", timeout=timeout)


def thread_of(fn: Callable[..., Any], *args: Any) -> threading.Thread:
    """A thread (not started) that calls fn(*args), then closes the database connection fn opened
    in it: a connection left to the thread's end stays open until it is collected, and the test
    database's drop fails while it is ("being accessed by other users")."""

    def body() -> None:
        try:
            fn(*args)
        finally:
            connection.close()

    return threading.Thread(target=body)


def race(fn: Callable[[], Any], n: int = 2) -> list[Any]:
    """Call fn in n threads released together by a barrier; return what each returned or raised.

    Each thread opens its database connection before the barrier: connecting takes longer than
    what a race's statements do, so a thread that connected first could otherwise finish before
    the other had sent anything (CI once saw a second delivery find the step already done, not
    being done)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def body(i: int) -> None:
        try:
            connection.ensure_connection()
            barrier.wait()
            results[i] = fn()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()  # each thread has its own connection; the test database must not keep it

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """The SQL of every statement this process sends meanwhile, through Django's cursors and the
    prepared ones of ``workflows.statements`` alike (``django_assert_num_queries`` sees only
    Django's): what a request waits for is one round trip each."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    psycopg.Cursor.execute = counted  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
