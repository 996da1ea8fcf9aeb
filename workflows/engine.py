"""Advancing a run: claim its lease, replay ``run()`` from the top, execute the next step,
then suspend (sleep, wait, retry, pause) or finish.

Completed steps answer from the step-result table; only the first step without a final row runs.
Control flow that must not be caught by workflow code (suspension, a lost lease) uses
BaseException subclasses, so ``except Exception`` in a workflow cannot swallow it.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.utils import timezone

from workflows import hooks, statements, step_store
from workflows.conf import conf
from workflows.context import in_step
from workflows.exceptions import (
    NonDeterminismError,
    NotSerializable,
    ResultTooLarge,
    StepError,
    StepTimeout,
    UnknownWorkflow,
    WaitTimeout,
)
from workflows.lease import heartbeat, lease_duration, new_owner
from workflows.logs import log_run
from workflows.logs import logger as state_logger
from workflows.metrics import RECOVERIES, RUNS_FINISHED, step_observed
from workflows.models import (
    FailureReason,
    RunEvent,
    RunStatus,
    StepKind,
    StepResult,
    StepStatus,
    WorkflowRun,
)
from workflows.outbox import emit_status, enqueue_run, enqueue_step
from workflows.registry import Event, get_workflow
from workflows.retries import DEFAULT_RETRIES, DEFAULT_TIMEOUT, Retries

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Timers this close are also sent as a Celery countdown, so short sleeps and retry backoffs do
# not wait for the next sweep. The database timer stays the authority; the sweeper is the backstop.
COUNTDOWN_MAX_SECONDS = 60.0


class _Suspended(BaseException):
    """The run stopped at a step boundary (sleep, wait, retry, pause); its state is stored."""


class _LeaseLost(BaseException):
    """Another worker owns the run now, or it was terminated or restarted: stop quietly."""


class _HandedBack(_Suspended):
    """The task used its time budget (WORKFLOWS_TASK_BUDGET): the run went back to the queue."""


class _LostRace(BaseException):
    """An atomic step found a final row already stored: roll the body back and adopt it."""


class Step:
    """The ``step`` argument of ``run()``: durable steps, sleeps and waits."""

    def __init__(
        self, run: WorkflowRun, owner: str, *, first_claim: bool = False, hand_back_at: float = float("inf")
    ) -> None:
        self._run = run
        self._owner = owner
        self._hand_back_at = hand_back_at  # time.monotonic(): past it, the next boundary hands the run back
        # A run claimed for the first time has stored nothing yet: no need to ask.
        self._stored = (
            {} if first_claim else {s.position: s for s in StepResult.objects.filter(run=run, attempt=run.attempt)}
        )
        self._position = 0
        # The last position an earlier execution of this attempt stored: until the body passes it,
        # it runs again what ran before (``replaying``).
        self._replay_to = max(self._stored, default=0)
        self._names: Counter[str] = Counter()
        self._pending: step_store.StepWrite | None = None

    @property
    def run_id(self) -> UUID:
        return self._run.id

    @property
    def replaying(self) -> bool:
        """Whether the body is re-running code between steps that an earlier execution of this
        attempt already ran (it went on to a later step): its progress reports and broadcasts
        were sent then, and are not sent again."""
        return self._position < self._replay_to

    @property
    def attempt(self) -> int:
        return int(self._run.attempt)

    # --- public API -------------------------------------------------------------------------
    def do(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: Retries | None = None,
        timeout: timedelta | float | None = None,
        atomic: bool = False,
        queue: str | None = None,
    ) -> Any:
        """Run ``fn(*args)`` once for this run; on replay return its stored result."""
        key, position, stored = self._enter(name, StepKind.DO)
        if stored is not None and stored.status == StepStatus.COMPLETED:
            return stored.result
        if stored is not None and stored.status == StepStatus.FAILED:
            raise StepError.from_record(key, stored.error)
        retries = retries or DEFAULT_RETRIES
        limit = _seconds(timeout if timeout is not None else DEFAULT_TIMEOUT)
        if not limit > 0:  # 0 would turn the timer off; NaN compares false too
            raise ValueError(f"step {key!r}: timeout must be more than 0 seconds, not {limit}")
        if limit > conf()["MAX_STEP_TIMEOUT_SECONDS"]:
            raise ValueError(f"step {key!r}: timeout {limit}s exceeds WORKFLOWS_MAX_STEP_TIMEOUT")
        if stored is not None and stored.status == StepStatus.RETRYING:
            if stored.wake_at is None:  # a dispatched try failed elsewhere: decide its backoff here
                self._after_failure(key, position, stored.tries, retries, stored.error or {}, None)
            assert stored.wake_at is not None  # set by _after_failure above
            if stored.wake_at > timezone.now():
                self._suspend_run(RunStatus.RETRYING, wake_at=stored.wake_at, wait_step=key)
        if queue is not None:
            return self._dispatched(key, position, stored, fn, args, queue, limit, retries)
        self._boundary(key)
        tries = (stored.tries if stored is not None else 0) + 1
        return self._try(key, position, tries, fn, args, retries, limit, atomic)

    def sleep(self, name: str, duration: timedelta | float) -> None:
        key, position, stored = self._enter(name, StepKind.SLEEP)
        if stored is None:
            self._boundary(key)
            self._sleep_new(key, position, timezone.now() + timedelta(seconds=_seconds(duration)))
        else:
            self._sleep_stored(key, stored)

    def sleep_until(self, name: str, when: datetime) -> None:
        key, position, stored = self._enter(name, StepKind.SLEEP)
        if stored is None:
            self._boundary(key)
            self._sleep_new(key, position, when)
        else:
            self._sleep_stored(key, stored)

    def wait_for_event(self, name: str, *, type: str, timeout: timedelta | float = timedelta(hours=24)) -> Any:
        """Return the payload of the oldest unconsumed event of ``type``, or raise WaitTimeout."""
        key, position, stored = self._enter(name, StepKind.WAIT)
        if stored is not None and stored.status == StepStatus.COMPLETED:
            return stored.result
        if stored is not None and stored.status == StepStatus.FAILED:
            raise WaitTimeout.from_record(key, stored.error)
        if stored is None:
            self._boundary(key)
        now = timezone.now()
        outcome: dict[str, Any] = {}
        with self._owned() as run:
            # The run row is locked before looking for the event: send_event locks it too, so an
            # event committed now is either seen here or wakes the run after this commit.
            event = (
                RunEvent.objects.filter(run=run, type=type, consumed_at__isnull=True)
                .order_by("created_at", "id")
                .first()
            )
            if event is not None:
                event.consumed_attempt, event.consumed_position, event.consumed_at = run.attempt, position, now
                event.save(update_fields=["consumed_attempt", "consumed_position", "consumed_at"])
                value, text = step_store.encode(event.payload, what=f"event {type!r}")
                self._store(key, position, StepKind.WAIT, StepStatus.COMPLETED, result_json=text, finished_at=now)
                outcome["value"] = value
            elif stored is not None and stored.wake_at is not None and stored.wake_at <= now:
                error = {
                    "type": WaitTimeout.__name__,
                    "message": f"no {type!r} event before {stored.wake_at.isoformat()}",
                }
                self._store(key, position, StepKind.WAIT, StepStatus.FAILED, error=error, finished_at=now)
                outcome["timeout"] = error
            else:
                wake_at = (stored.wake_at if stored is not None else None) or now + timedelta(seconds=_seconds(timeout))
                if stored is None:
                    self._store(key, position, StepKind.WAIT, StepStatus.WAITING, wake_at=wake_at, started_at=now)
                self._set_suspended(run, RunStatus.WAITING, wake_at=wake_at, wait_step=key, wait_event_type=type)
        if "value" in outcome:
            return outcome["value"]
        if "timeout" in outcome:
            raise WaitTimeout.from_record(key, outcome["timeout"])
        raise _Suspended

    # --- replay bookkeeping --------------------------------------------------------------------
    def _enter(self, name: str, kind: str) -> tuple[str, int, StepResult | None]:
        self._position += 1
        self._names[name] += 1
        key = name if self._names[name] == 1 else f"{name}#{self._names[name]}"
        stored = self._stored.get(self._position)
        if stored is not None and (stored.name != key or stored.kind != kind):
            raise NonDeterminismError(
                f"step {self._position} was recorded as {stored.kind} {stored.name!r} "
                f"but the workflow now reaches {kind} {key!r} there"
            )
        return key, self._position, stored

    def _boundary(self, key: str) -> None:
        """Before a new step: stop if the lease is gone, pause if asked, else extend the lease.

        The previous step's result rides in the same statement (one commit a step): it was held
        back only while replay ran to here, so a crash in between loses no more than a crash
        inside the step's body would.
        """
        if time.monotonic() > self._hand_back_at:
            self._hand_back()
        write, self._pending = self._pending, None
        may_continue, written = _reconnecting(
            lambda: statements.checkpoint(
                run_id=self._run.id,
                owner=self._owner,
                current_step=key,
                lease_until=timezone.now() + lease_duration(),
                write=write,
            )
        )
        if not written:
            raise _LeaseLost  # another worker stored that step first: it owns the run now
        if may_continue:
            return
        with self._owned() as run:
            if not run.pause_requested:
                raise _LeaseLost
            run.pause()
            self._save_released(run)
            log_run(run, "paused", step=key, later=True)
        raise _Suspended

    def _hand_back(self) -> None:
        """Put the run back on the queue, for a new task to go on with it.

        One task runs a run's steps one after another; bounding how long it may (the budget) is
        what lets Celery's hard time limit stay at budget + longest step timeout + grace, so a
        child stuck for good is killed without killing a healthy long run.
        """
        with self._owned() as run:
            run.hand_back(now=timezone.now())
            self._save_released(run)
            enqueue_run(run.id, queue=run.queue)
            log_run(run, "handed_back", later=True)
        raise _HandedBack

    @contextmanager
    def _owned(self) -> Iterator[WorkflowRun]:
        """Lock the run row for a transition; raise _LeaseLost unless this worker still owns it."""
        write = self._pending
        try:
            with transaction.atomic():
                self.flush()
                run = WorkflowRun.objects.select_for_update().get(pk=self._run.id)
                if run.lease_owner != self._owner or run.status != RunStatus.RUNNING:
                    raise _LeaseLost
                yield run
        except BaseException:
            # The held-back result rode in the transaction that rolled back: it is still to store.
            if self._pending is None:
                self._pending = write
            raise

    def flush(self) -> None:
        """Store the held-back result of the last step now."""
        write, self._pending = self._pending, None
        if write is not None and not step_store.store(write):
            raise _LeaseLost

    def take_pending(self) -> step_store.StepWrite | None:
        write, self._pending = self._pending, None
        return write

    def _save_released(self, run: WorkflowRun) -> None:
        """Store the run after a transition that released it, and push its status on commit."""
        run.save()
        emit_status(run)

    def _set_suspended(
        self, run: WorkflowRun, status: str, *, wake_at: datetime, wait_step: str = "", wait_event_type: str = ""
    ) -> None:
        if status == RunStatus.WAITING:
            run.wait(until=wake_at, step=wait_step, event_type=wait_event_type)
        elif status == RunStatus.SLEEPING:
            run.sleep(until=wake_at, step=wait_step)
        else:
            run.retry_later(until=wake_at, step=wait_step)
        self._save_released(run)
        log_run(run, status, step=wait_step, later=True)
        seconds = (wake_at - timezone.now()).total_seconds()
        if status != RunStatus.WAITING and seconds <= COUNTDOWN_MAX_SECONDS:
            enqueue_run(run.id, queue=run.queue, countdown=max(seconds, 0.0))

    def _suspend_run(self, status: str, *, wake_at: datetime, wait_step: str = "") -> None:
        with self._owned() as run:
            self._set_suspended(run, status, wake_at=wake_at, wait_step=wait_step)
        raise _Suspended

    def _write(self, key: str, position: int, kind: str, status: str, **fields: Any) -> step_store.StepWrite:
        return step_store.StepWrite(
            run_id=self._run.id,
            attempt=self._run.attempt,
            position=position,
            name=key,
            kind=kind,
            status=status,
            **fields,
        )

    def _store(self, key: str, position: int, kind: str, status: str, **fields: Any) -> bool:
        self.flush()
        return step_store.store(self._write(key, position, kind, status, **fields))

    # --- sleeps ---------------------------------------------------------------------------------
    def _sleep_new(self, key: str, position: int, wake_at: datetime) -> None:
        now = timezone.now()
        if wake_at <= now:
            self._store(key, position, StepKind.SLEEP, StepStatus.COMPLETED, started_at=now, finished_at=now)
            return
        with self._owned() as run:
            self._store(key, position, StepKind.SLEEP, StepStatus.SLEEPING, wake_at=wake_at, started_at=now)
            self._set_suspended(run, RunStatus.SLEEPING, wake_at=wake_at, wait_step=key)
        raise _Suspended

    def _sleep_stored(self, key: str, stored: StepResult) -> None:
        if stored.status == StepStatus.COMPLETED:
            return
        assert stored.wake_at is not None
        if stored.wake_at > timezone.now():
            self._suspend_run(RunStatus.SLEEPING, wake_at=stored.wake_at, wait_step=key)
        self.flush()
        StepResult.objects.filter(pk=stored.pk).update(status=StepStatus.COMPLETED, finished_at=timezone.now())

    # --- step bodies ----------------------------------------------------------------------------
    def _try(
        self,
        key: str,
        position: int,
        tries: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        retries: Retries,
        limit: float,
        atomic: bool,
    ) -> Any:
        started = timezone.now()
        message = f"step {key!r} try {tries} ran past its timeout of {limit:g}s"
        run_id, owner = self._run.id, self._owner
        try:
            # The heartbeat renews the lease only until the timeout plus a grace: a body stuck past
            # it (StepTimeout swallowed, C code with signals blocked) lets another worker recover
            # the run, and after another grace the watchdog (workflows/watchdog.py) ends this process.
            heartbeat.step_started(run_id, limit)
            try:
                if atomic:
                    # The body's writes and the step result commit together, or neither does.
                    with transaction.atomic():
                        with step_store.time_limit(limit, message), in_step(run_id, self._run.attempt, key, owner):
                            value = fn(*args)
                        value, text = step_store.encode(value, what=f"the result of step {key!r}")
                        finished = timezone.now()
                        if not self._store(
                            key,
                            position,
                            StepKind.DO,
                            StepStatus.COMPLETED,
                            result_json=text,
                            tries=tries,
                            started_at=started,
                            finished_at=finished,
                        ):
                            raise _LostRace
                    self._step_ended(key, "completed", started, finished, tries)
                    return value
                with step_store.time_limit(limit, message), in_step(run_id, self._run.attempt, key, owner):
                    value = fn(*args)
            finally:
                heartbeat.step_ended(run_id)
            value, text = step_store.encode(value, what=f"the result of step {key!r}")
        except _LostRace:
            return self._adopt(key, position)
        except Exception as exc:
            error, cause = step_store.error_record(exc), exc  # (a name the closure keeps after the block)
            ends = error.get("non_retryable") or tries > retries.limit
            self._step_ended(key, "failed" if ends else "retried", started, timezone.now(), tries, error)
            # The connection may have died while the body ran (it is the worker's, not the step's):
            # reconnect and record the try.
            _reconnecting(lambda: self._after_failure(key, position, tries, retries, error, cause))
        # Held back until the next boundary (or the run's end), which writes it in its statement.
        finished = timezone.now()
        self._pending = self._write(
            key,
            position,
            StepKind.DO,
            StepStatus.COMPLETED,
            result_json=text,
            tries=tries,
            started_at=started,
            finished_at=finished,
        )
        self._step_ended(key, "completed", started, finished, tries)
        return value

    def _step_ended(
        self,
        key: str,
        outcome: str,
        started: datetime,
        finished: datetime,
        tries: int,
        error: dict[str, Any] | None = None,
    ) -> None:
        """A try of a step's body ended (completed, retried or failed): its metrics and log line.
        A completed step's result is stored with the next checkpoint (or the run's end)."""
        seconds = (finished - started).total_seconds()
        step_observed(self._run.workflow, outcome, seconds, tries)
        state_logger.info(
            "run %s step %r try %d %s in %.3fs",
            self._run.id,
            key,
            tries,
            outcome,
            seconds,
            extra={
                "event": f"step.{outcome}",
                "run_id": str(self._run.id),
                "attempt": self._run.attempt,
                "step": key,
                "workflow": self._run.workflow,
                "tries": tries,
                "duration_ms": round(seconds * 1000, 3),
                **({"error_type": error.get("type")} if error else {}),
            },
        )

    def _adopt(self, key: str, position: int) -> Any:
        """Another worker stored this step first: its result is the step's result."""
        winner = step_store.load(self._run.id, self._run.attempt, position)
        if winner.status == StepStatus.FAILED:
            raise StepError.from_record(key, winner.error)
        return winner.result

    def _after_failure(
        self,
        key: str,
        position: int,
        tries: int,
        retries: Retries,
        error: dict[str, Any],
        exc: BaseException | None,
    ) -> None:
        """Record a failed try; fail the step for good (raise StepError) or suspend for a retry."""
        now = timezone.now()
        if error.get("non_retryable") or tries > retries.limit:
            # Under the lease like every other write of a try: a try that outlived its lease (another
            # worker recovered the run) stores nothing.
            with self._owned():
                self._store(key, position, StepKind.DO, StepStatus.FAILED, error=error, tries=tries, finished_at=now)
            raise StepError(key, str(error.get("type")), str(error.get("message"))) from exc
        wake_at = now + retries.delay_before(tries)
        with self._owned() as run:
            self._store(key, position, StepKind.DO, StepStatus.RETRYING, error=error, tries=tries, wake_at=wake_at)
            self._set_suspended(run, RunStatus.RETRYING, wake_at=wake_at, wait_step=key)
        raise _Suspended

    def _dispatched(
        self,
        key: str,
        position: int,
        stored: StepResult | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        queue: str,
        limit: float,
        retries: Retries,
    ) -> Any:
        """Send the step to ``queue`` as its own task; the run waits for it."""
        now = timezone.now()
        if stored is not None and stored.status == StepStatus.RUNNING:
            assert stored.wake_at is not None
            if stored.wake_at <= now:  # the task never reported back in time: a failed try
                error = {
                    "type": StepTimeout.__name__,
                    "message": f"step {key!r} try {stored.tries} sent to "
                    f"queue {queue!r} did not finish within {limit:g}s",
                }
                self._after_failure(key, position, stored.tries, retries, error, None)
            self._suspend_run(RunStatus.WAITING, wake_at=stored.wake_at, wait_step=key)
        self._boundary(key)
        reference = _reference(fn, key)
        args_value, _ = step_store.encode(list(args), what=f"the arguments of step {key!r}")
        tries = (stored.tries if stored is not None else 0) + 1
        deadline = now + timedelta(seconds=limit + conf()["LEASE_SECONDS"])
        call = {"fn": reference, "args": args_value, "timeout": limit}
        with self._owned() as run:
            self._store(
                key, position, StepKind.DO, StepStatus.RUNNING, call=call, tries=tries, wake_at=deadline, started_at=now
            )
            self._set_suspended(run, RunStatus.WAITING, wake_at=deadline, wait_step=key)
            enqueue_step(run.id, run.attempt, position, tries, queue=queue)
        raise _Suspended


def _reference(fn: Callable[..., Any], key: str) -> str:
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<" in qualname:
        raise ValueError(f"step {key!r} uses queue=, so its function must be importable by name, not {qualname!r}")
    return f"{fn.__module__}:{qualname}"


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _reconnecting(operation: Callable[[], T]) -> T:
    """Run an engine write; if it fails on a lost database connection, reconnect and run it once more.

    The connection is most often lost while a step body ran (a failover, a proxy's idle timeout,
    pg_terminate_backend) and nobody noticed until the engine's next statement. Every engine write
    is conditional on the lease and never overwrites a final step row, so running one again is
    safe. Inside an atomic block (an atomic step's transaction) nothing can be run again here.
    """
    try:
        return operation()
    except (OperationalError, InterfaceError):
        db = connections[DEFAULT_DB_ALIAS]
        if db.in_atomic_block:
            raise
        logger.warning("database error in the engine; reconnecting if needed and trying once more", exc_info=True)
        if not db.is_usable():
            db.close()
        return operation()


# --- advancing a run ---------------------------------------------------------------------------
def advance(run_id: UUID | str) -> str:
    """Advance the run as far as it goes now. Returns what happened (for logs and tests)."""
    hand_back_at = time.monotonic() + conf()["TASK_BUDGET_SECONDS"]
    owner = new_owner()
    now = timezone.now()
    claimed = statements.claim_run(run_id, owner, now, now + lease_duration())
    if claimed is None:
        return "not_claimed"
    run, recovered = claimed
    first_claim = run.started_at == now and run.attempt == 1
    if recovered:
        RECOVERIES.labels("lease_expired").inc()
    log_run(
        run,
        "recovered" if recovered else "started" if first_claim else "claimed",
        recoveries=run.recovery_count,
    )
    emit_status(run)
    heartbeat.register(run.id, owner)
    try:
        # claim sets started_at only if it was empty: equal to now means no worker ran it before.
        return _execute(run, owner, first_claim=first_claim, hand_back_at=hand_back_at)
    finally:
        heartbeat.unregister(run.id)


def _execute(run: WorkflowRun, owner: str, *, first_claim: bool = False, hand_back_at: float = float("inf")) -> str:
    if run.recovery_count > conf()["MAX_RECOVERY_ATTEMPTS"]:
        error = {
            "type": "MaxRecoveryAttempts",
            "message": f"the run's worker was lost {run.recovery_count} times"
            f" (limit {conf()['MAX_RECOVERY_ATTEMPTS']}); it is not retried again",
        }
        return _finish(run, owner, failed=error, reason=FailureReason.MAX_RECOVERY_ATTEMPTS)
    try:
        cls = get_workflow(run.workflow)
    except UnknownWorkflow as exc:
        return _finish(run, owner, failed=step_store.error_record(exc), reason=FailureReason.UNKNOWN_WORKFLOW)
    instance = cls()
    instance.run_id = run.id
    event = Event(
        payload=run.payload,
        run_id=run.id,
        created_at=run.created_at,
        attempt=run.attempt,
        owner_id=run.owner_id,
        version=run.workflow_version,
    )
    step = Step(run, owner, first_claim=first_claim, hand_back_at=hand_back_at)
    instance._engine_step = step
    try:
        value = instance.run(event, step)
        value, _ = step_store.encode(value, what="the run's result")
    except _HandedBack:
        return "handed_back"
    except _Suspended:
        return "suspended"
    except _LeaseLost:
        _store_held_back(step)
        return "lease_lost"
    except NonDeterminismError as exc:
        return _finish(run, owner, failed=step_store.error_record(exc), reason=FailureReason.NON_DETERMINISM, step=step)
    except (OperationalError, InterfaceError):
        # The database, not the workflow: the engine's statement failed even after reconnecting.
        # The run is left to recovery (its lease expires, the sweeper enqueues it again); failing
        # it here would fail a healthy workflow for good over a failover.
        RECOVERIES.labels("database_error").inc()
        logger.warning(
            "run %s: database unavailable; left to recovery",
            run.id,
            exc_info=True,
            extra={"event": "run.left_to_recovery", "run_id": str(run.id), "attempt": run.attempt},
        )
        _store_held_back(step)
        return "database_error"
    except Exception as exc:
        error = step_store.error_record(exc)
        if not isinstance(exc, (StepError, NotSerializable, ResultTooLarge)):
            error["traceback"] = step_store.storable_text(traceback.format_exc(limit=20))
        return _finish(run, owner, failed=error, reason=FailureReason.ERROR, step=step)
    return _finish(run, owner, result=value, step=step)


def _store_held_back(step: Step) -> None:
    """Store the result a step completed with, if this worker still holds it: it is the step's,
    whoever goes on with the run. Best effort: if it cannot be stored, the step runs again."""
    try:
        _reconnecting(step.flush)
    except (_LeaseLost, DatabaseError):
        pass


def _finish(
    run: WorkflowRun,
    owner: str,
    *,
    result: Any = None,
    failed: dict[str, Any] | None = None,
    reason: str = "",
    step: Step | None = None,
) -> str:
    """End the run, with the last step's held-back result, in one conditional statement.

    If PostgreSQL refuses to store that end (a DataError, say, for a value the encoder let
    through), the run fails with that error and the last step is stored as well as it can be. Left
    to raise, the task would end with the lease held, and recovery would run completed steps again
    up to WORKFLOWS_MAX_RECOVERY_ATTEMPTS times. A lost connection (after one reconnect) does
    raise: the run is then the worker's problem, left to recovery.
    """
    write = step.take_pending() if step is not None else None
    try:
        ended = _finish_run(run, owner, result=result, failed=failed, reason=reason, write=write)
    except DatabaseError as exc:
        if isinstance(exc, (OperationalError, InterfaceError)):
            raise
        logger.warning("run %s: its end could not be stored", run.id, exc_info=True)
        error = step_store.error_record(exc)
        error["message"] = f"the run's end could not be stored: {error['message']}"
        if write is not None:
            _store_last_step(write, error)
        # ``run`` took the transition to its end in memory; the row is still running.
        ended = _finish_run(
            WorkflowRun.objects.get(pk=run.pk), owner, failed=error, reason=FailureReason.ERROR, write=None
        )
    if ended is None:
        return "lease_lost"
    RUNS_FINISHED.labels(ended.workflow, ended.status, ended.failure_reason).inc()
    # The error's type only: its message may quote what the step was given.
    log_run(ended, str(ended.status), reason=ended.failure_reason, error_type=str((ended.error or {}).get("type", "")))
    if ended.status == RunStatus.FAILED:
        _fire_failed(run.id)
    return str(ended.status)


def _fire_failed(run_id: UUID) -> None:
    """``hooks.fire_run_failed``, in a transaction of its own with the run row locked, if the run is
    still failed (staff may have restarted it since). The end is stored already (one statement, no
    transaction to join), so a hook that raises is logged, not raised: the run stays failed."""
    try:
        with transaction.atomic():
            run = WorkflowRun.objects.select_for_update().filter(pk=run_id, status=RunStatus.FAILED).first()
            if run is not None:
                hooks.fire_run_failed(run)
    except Exception:
        logger.exception("run %s: a hook on its failure raised", run_id)


def _store_last_step(write: step_store.StepWrite, error: dict[str, Any]) -> None:
    """The last step's result alone, or, if that is what PostgreSQL refused, the step as failed."""
    try:
        _reconnecting(lambda: step_store.store(write))
    except DatabaseError as exc:
        if isinstance(exc, (OperationalError, InterfaceError)):
            raise
        failed = replace(write, status=StepStatus.FAILED, result_json=None, error={**error, "non_retryable": True})
        _reconnecting(lambda: step_store.store(failed))


def _finish_run(
    run: WorkflowRun,
    owner: str,
    *,
    result: Any = None,
    failed: dict[str, Any] | None = None,
    reason: str = "",
    write: step_store.StepWrite | None,
) -> WorkflowRun | None:
    """Write the run's end; the ended run, or None if it was no longer this worker's to end."""
    now = timezone.now()
    # The FSM checks the transition on the claimed (running) run; statements.finish writes what it set.
    if failed is None:
        run.complete(result=result, now=now)
    else:
        run.fail(error=failed, reason=reason, now=now)
    finished, _ = _reconnecting(lambda: statements.finish(run=run, owner=owner, now=now, write=write))
    if not finished:
        return None
    emit_status(run)
    return run
