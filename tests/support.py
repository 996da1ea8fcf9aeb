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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from django.db import connection

if TYPE_CHECKING:
    from workflows.models import WorkflowRun

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def service_env(**overrides: str) -> dict[str, str]:
    """The test process's environment, pointed at the test database pytest-django created."""
    env = dict(os.environ)
    settings_dict = connection.settings_dict
    env["DATABASE_URL"] = (
        f"postgres://{settings_dict['USER'] or 'postgres'}@{settings_dict['HOST'] or '127.0.0.1'}:"
        f"{settings_dict['PORT'] or 5432}/{settings_dict['NAME']}"
    )
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

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


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


def race(fn: Callable[[], Any], n: int = 2) -> list[Any]:
    """Call fn in n threads released together by a barrier; return what each returned or raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def body(i: int) -> None:
        try:
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
