"""Leases: which worker may advance a run, for how long, and the heartbeat that extends them.

A worker claims a run with one conditional UPDATE (free lease, claimable state; see
``statements.claim``). Every step boundary re-checks and extends the lease in the statement that
stores the previous step's result (``statements.checkpoint``), so a worker whose lease was taken
over (or whose run was terminated or restarted) stops before its next step. A background thread
extends the leases of runs whose current step takes longer than a third of the lease, but not of
a run whose step body is past its timeout by WORKFLOWS_STEP_TIMEOUT_GRACE: that body swallowed
StepTimeout or is stuck where the signal cannot reach it, and the run is better recovered by
another worker process than held for ever by this one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from uuid import UUID

from django.db import close_old_connections, connection
from django.utils import timezone

from workflows.conf import conf
from workflows.metrics import RECOVERIES
from workflows.models import WorkflowRun

logger = logging.getLogger(__name__)


def lease_duration() -> timedelta:
    return timedelta(seconds=conf()["LEASE_SECONDS"])


def new_owner() -> str:
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:10]}"


class Heartbeat:
    """One daemon thread per process extending the leases of the runs it is advancing.

    It sleeps a third of the lease before its first beat, so a run that advances quickly never
    costs it a database round trip.
    """

    def __init__(self) -> None:
        self._leases: dict[UUID, str] = {}
        # time.monotonic() at which the step body a run is in should have ended. Written by the
        # engine around every body without the lock: one dict store, atomic under the GIL.
        self._deadlines: dict[UUID, float] = {}
        self._overran: set[UUID] = set()  # runs whose overrun was reported (by the heartbeat thread only)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def register(self, run_id: UUID, owner: str) -> None:
        with self._lock:
            self._leases[run_id] = owner
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="workflows-heartbeat", daemon=True)
                self._thread.start()

    def unregister(self, run_id: UUID) -> None:
        with self._lock:
            self._leases.pop(run_id, None)
            self._deadlines.pop(run_id, None)
            self._overran.discard(run_id)

    def step_started(self, run_id: UUID, timeout: float) -> None:
        self._deadlines[run_id] = time.monotonic() + timeout

    def step_ended(self, run_id: UUID) -> None:
        self._deadlines.pop(run_id, None)

    def overdue(self, run_id: UUID) -> bool:
        """Is the run's step body past its timeout plus the grace?"""
        deadline = self._deadlines.get(run_id)
        return deadline is not None and time.monotonic() > deadline + conf()["STEP_TIMEOUT_GRACE_SECONDS"]

    def _loop(self) -> None:
        while True:
            time.sleep(self._interval())
            try:
                self._beat()
            except Exception:  # the next beat may hold: a thread that ended would extend no lease again
                logger.warning("heartbeat failed; trying again at the next beat", exc_info=True)

    @staticmethod
    def _interval() -> float:
        """A third of the lease, read at every beat. While Django swaps its settings (a test's
        override, from another thread: the swap is not atomic) they cannot be read; then a second."""
        try:
            return conf()["LEASE_SECONDS"] / 3
        except AttributeError:
            return 1.0

    def _beat(self) -> None:
        with self._lock:
            leases = dict(self._leases)
        if not leases:
            connection.close()  # hold no idle connection between runs
            return
        for run_id, owner in leases.items():
            if self.overdue(run_id):
                if run_id not in self._overran:  # counted and logged once, not at every beat
                    self._overran.add(run_id)
                    RECOVERIES.labels("step_overran").inc()
                    logger.warning(
                        "run %s: its step is past its timeout and grace; its lease is left to expire so "
                        "another worker recovers the run",
                        run_id,
                        extra={"event": "run.step_overran", "run_id": str(run_id)},
                    )
                continue
            try:
                close_old_connections()
                WorkflowRun.objects.filter(pk=run_id, lease_owner=owner).update(
                    lease_expires_at=timezone.now() + lease_duration()
                )
            except Exception:
                logger.warning("heartbeat for run %s failed", run_id, exc_info=True)


heartbeat = Heartbeat()
