"""The watchdog: a worker process whose step body is stuck far past its timeout ends itself.

A step body runs under a SIGALRM timer (``step_store.time_limit``). A body that cannot be
interrupted (C code with SIGALRM blocked, a StepTimeout swallowed in a loop) holds its worker
process. The heartbeat stops renewing the run's lease at timeout + WORKFLOWS_STEP_TIMEOUT_GRACE, so
another process recovers the run; at timeout + twice the grace this thread SIGKILLs its own process,
and the pool starts a fresh one, as after any worker crash.

Celery's hard time limit was meant to do this, and still stands behind it, but it is a limit on the
whole task (budget + the longest step timeout + grace: over an hour by default, where a stuck
10-second step needs a minute), and under a loaded machine it was seen not to fire at all.

Armed only in a prefork pool child, where the process runs one task at a time and the pool
replaces it: never in a solo or threads worker, a web process, or the test process.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import signals

from workflows.conf import conf
from workflows.metrics import RECOVERIES

logger = logging.getLogger(__name__)


class Watchdog:
    def __init__(self) -> None:
        self.armed = False
        self._ends: dict[int, tuple[float, str]] = {}  # body -> (time.monotonic() to end at, what it is)
        self._tokens = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, seconds: float, what: str) -> Iterator[None]:
        """While the block runs, end this process if it lasts ``seconds`` + twice the grace."""
        if not self.armed:
            yield
            return
        token = next(self._tokens)
        end = time.monotonic() + seconds + 2 * conf()["STEP_TIMEOUT_GRACE_SECONDS"]
        with self._changed:
            self._ends[token] = (end, what)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="workflows-watchdog", daemon=True)
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                del self._ends[token]

    def _loop(self) -> None:
        with self._changed:
            while True:
                if not self._ends:
                    self._changed.wait()
                    continue
                end, what = min(self._ends.values())
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)  # woken early by a new body; a finished one is seen then
        # Outside the lock, and once: the kill does not return (a test that records it instead must
        # not find the thread spinning on the lock the body needs to leave ``watching``).
        self._end_process(what)

    def _end_process(self, what: str) -> None:
        RECOVERIES.labels("process_ended").inc()
        logger.error(
            "%s and twice the grace, and cannot be interrupted: this worker process (pid %s) ends "
            "itself so the pool starts a new one",
            what,
            os.getpid(),
            extra={"event": "worker.process_ended", "pid": os.getpid()},
        )
        os.kill(os.getpid(), signal.SIGKILL)


watchdog = Watchdog()


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]  # celery has no types
def arm(**kwargs: Any) -> None:
    """Sent in each prefork pool child after the fork, and by a solo pool in the worker's own
    process, which nothing would replace: only a pool child (a daemonic process) is armed."""
    from billiard.process import current_process

    watchdog.armed = bool(current_process().daemon)
