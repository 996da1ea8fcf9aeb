"""Storage of step results: the memo that makes a completed step never run again."""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from workflows.conf import conf
from workflows.exceptions import NotSerializable, ResultTooLarge, StepTimeout
from workflows.models import StepResult, StepStatus
from workflows.storable import json_problem, text_problem
from workflows.watchdog import watchdog

logger = logging.getLogger(__name__)

# A step row in one of these states is never written again (see upsert_sql).
FINAL = (StepStatus.COMPLETED, StepStatus.FAILED)


def encode(value: Any, *, what: str) -> tuple[Any, str]:
    """The value as stored (a JSON round trip, so a first pass and a replay see the same thing).

    Refuses (NotSerializable, so the step fails at once) what PostgreSQL's jsonb cannot store: a
    NUL character or an unpaired surrogate in any string. Refused here, the error is the step's;
    let through, the held-back write would fail at the next step's checkpoint or at the run's end.
    """
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NotSerializable(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise NotSerializable(f"{what} is nested too deeply to encode as JSON") from None
    limit = conf()["MAX_RESULT_BYTES"]
    if len(text) > limit:
        raise ResultTooLarge(
            f"{what} is {len(text):,} bytes of JSON; the limit is {limit:,} (WORKFLOWS_MAX_RESULT_BYTES)"
        )
    stored = json.loads(text)
    # json.dumps escapes NUL as \u0000 and every surrogate as \ud8xx-\udfxx, so a text without
    # either needs no walk (the hot path). A match may be an escaped backslash, Korean text or a
    # valid pair: the walk of the decoded value decides (decoding joins valid pairs). Depth is not
    # bounded here beyond what json.dumps allows: a step result is not a request body.
    if "\\u" in text and _SUSPECT.search(text) is not None and (problem := json_problem(stored, max_depth=sys.maxsize)):
        raise NotSerializable(f"{what} {problem}")
    return stored, text


_SUSPECT = re.compile(r"\\u(?:0000|d[89a-f])")


def storable_text(text: str) -> str:
    """``text`` with what PostgreSQL cannot store escaped (for error messages and tracebacks)."""
    if text_problem(text) is None:
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class StepWrite:
    """One step row to write (see ``store``)."""

    run_id: UUID
    attempt: int
    position: int
    name: str
    kind: str
    status: str
    result_json: str | None = None
    error: dict[str, Any] | None = None
    call: dict[str, Any] | None = None
    tries: int = 0
    wake_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


def json_param(vendor: str | None = None) -> str:
    return "%s::jsonb" if (vendor or connection.vendor) == "postgresql" else "%s"


def adapt(db: BaseDatabaseWrapper, value: Any) -> Any:
    """A UUID or datetime as the database wants it in a raw statement (psycopg takes both as they
    are; SQLite stores UUIDs as hex and datetimes as text)."""
    if db.vendor == "postgresql" or value is None:
        return value
    if isinstance(value, UUID):
        return value.hex
    if isinstance(value, datetime):
        return db.ops.adapt_datetimefield_value(value)
    return value


def upsert_sql(vendor: str | None = None) -> str:
    """INSERT of a step row that never overwrites a final one, RETURNING id only if it wrote.

    A final row (completed or failed) stays as it is: the loser of a race gets no row back and
    adopts the stored one.
    """
    table = StepResult._meta.db_table
    j = json_param(vendor)
    return f"""
        INSERT INTO {table}
            (run_id, attempt, position, name, kind, status, result, error, call, tries, wake_at,
             started_at, finished_at)
        VALUES (%s, %s, %s, %s, %s, %s, {j}, {j}, {j}, %s, %s, %s, %s)
        ON CONFLICT (run_id, attempt, position) DO UPDATE SET
            name = EXCLUDED.name, kind = EXCLUDED.kind, status = EXCLUDED.status,
            result = EXCLUDED.result, error = EXCLUDED.error, call = EXCLUDED.call, tries = EXCLUDED.tries,
            wake_at = EXCLUDED.wake_at, finished_at = EXCLUDED.finished_at
        WHERE {table}.status NOT IN ({", ".join(f"'{status}'" for status in FINAL)})
        RETURNING id
    """


def upsert_params(write: StepWrite, db: BaseDatabaseWrapper | None = None) -> list[Any]:
    db = db or connections[DEFAULT_DB_ALIAS]
    return [
        adapt(db, write.run_id),
        write.attempt,
        write.position,
        write.name,
        write.kind,
        write.status,
        write.result_json,
        json.dumps(write.error) if write.error is not None else None,
        json.dumps(write.call) if write.call is not None else None,
        write.tries,
        adapt(db, write.wake_at),
        adapt(db, write.started_at),
        adapt(db, write.finished_at),
    ]


def store(write: StepWrite) -> bool:
    """Write the step's row unless a final one is already stored. True if this call wrote it."""
    with connection.cursor() as cursor:
        cursor.execute(upsert_sql(), upsert_params(write))
        return cursor.fetchone() is not None


def load(run_id: UUID, attempt: int, position: int) -> StepResult:
    return StepResult.objects.get(run_id=run_id, attempt=attempt, position=position)


def error_record(exc: BaseException) -> dict[str, Any]:
    from workflows.exceptions import NonRetryableError, StepError

    if isinstance(exc, StepError):
        return {"type": exc.error_type, "message": exc.message, "step": exc.step}
    return {
        "type": type(exc).__name__,
        "message": storable_text(str(exc)),  # a message may quote the value that could not be stored
        "non_retryable": isinstance(exc, NonRetryableError),
    }


@contextmanager
def time_limit(seconds: float, message: str) -> Iterator[None]:
    """Interrupt the body after ``seconds`` with StepTimeout.

    Uses SIGALRM, which only the main thread can receive (a Celery prefork or solo worker runs
    tasks there). A body that returns after ``seconds`` all the same (it caught StepTimeout, or
    ran where the handler could not: another thread, C code with SIGALRM blocked) also ends in
    StepTimeout when it returns, so its late result is never stored (inside ``atomic=True`` its
    writes are rolled back). Stuck for good, it is left to the heartbeat (which stops renewing the
    run's lease after a grace) and to the watchdog (which ends the worker process after another).
    """
    if not seconds > 0:  # 0 would disable the timer; a negative one fails inside setitimer
        raise ValueError(f"a step timeout must be more than 0 seconds, not {seconds}")

    def on_alarm(signum: int, frame: Any) -> None:
        raise StepTimeout(message)

    alarm = threading.current_thread() is threading.main_thread()
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, on_alarm) if alarm else None
    try:
        try:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, seconds)
            with watchdog.watching(seconds, message):
                yield
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
        if time.monotonic() - started > seconds:
            raise StepTimeout(message)
    except StepTimeout:
        _cancel_interrupted_query()
        raise


def _cancel_interrupted_query() -> None:
    """After a StepTimeout: if it interrupted a query, the connection is still busy with it (psycopg
    only cancels on KeyboardInterrupt) and the query runs on in PostgreSQL. Cancel it there and drop
    the connection (the next statement opens a new one).

    Inside an atomic block the connection is left open: Django's atomic() rolls back on the way
    out, finds the connection unusable and closes it itself, keeping its transaction state right.
    """
    db = connections[DEFAULT_DB_ALIAS]
    raw = db.connection
    if db.vendor != "postgresql" or raw is None or raw.closed:
        return
    from psycopg import pq

    if raw.info.transaction_status != pq.TransactionStatus.ACTIVE:
        return
    try:
        raw.cancel_safe(timeout=5)
    except Exception:  # the connection is dropped all the same
        logger.warning("could not cancel the query a step timeout interrupted", exc_info=True)
    if not db.in_atomic_block:
        db.close()
