"""The engine's hot statements, one database round trip and one commit each.

Each is a conditional write: it only takes effect for the worker that holds the run's lease and
while the run is ``running``, so it is safe against a concurrent terminate, restart or takeover
without a prior ``SELECT … FOR UPDATE``. On PostgreSQL the writes that belong together ride in one
statement (data-modifying CTEs); elsewhere (the SQLite demo) they run in one transaction.

The status they set follows the transitions declared on ``WorkflowRun``: ``claim`` is ``begin``
or ``wake``+``begin``, ``finish`` is ``complete`` or ``fail``, and the engine checks those
transitions on its in-memory run before calling ``finish``.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from workflows.models import CLAIMABLE, TIMED, RunAttempt, RunStatus, WorkflowRun
from workflows.steps import StepWrite, json_param, upsert_params, upsert_sql

RUNS = WorkflowRun._meta.db_table
ATTEMPTS = RunAttempt._meta.db_table


def _id(run_id: UUID | str) -> Any:
    return WorkflowRun._meta.pk.get_db_prep_value(UUID(str(run_id)), connection)


def _dt(value: datetime | None) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def _in(values: list[RunStatus]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def claim(run_id: UUID | str, owner: str, now: datetime, lease_until: datetime) -> WorkflowRun | None:
    """Take the lease of a run that is ready to advance and free; the claimed row, or None.

    A lease that expired while still naming an owner means that worker died mid-run: the claim
    counts one recovery.
    """
    sql = f"""
        UPDATE {RUNS} SET
            status = '{RunStatus.RUNNING}', lease_owner = %s, lease_expires_at = %s,
            recovery_count = CASE WHEN lease_owner <> '' THEN recovery_count + 1 ELSE recovery_count END,
            started_at = COALESCE(started_at, %s), updated_at = %s,
            wake_at = NULL, wait_event_type = '', wait_step = ''
        WHERE id = %s
          AND (lease_expires_at IS NULL OR lease_expires_at < %s)
          AND (status IN ({_in(CLAIMABLE)}) OR (status IN ({_in(TIMED)}) AND wake_at <= %s))
        RETURNING *
    """
    params = [owner, _dt(lease_until), _dt(now), _dt(now), _id(run_id), _dt(now), _dt(now)]
    rows = list(WorkflowRun.objects.raw(sql, params))
    return rows[0] if rows else None


def _extend_sql() -> str:
    return f"""
        UPDATE {RUNS} SET lease_expires_at = %s, current_step = %s
        WHERE id = %s AND lease_owner = %s AND status = '{RunStatus.RUNNING}' AND NOT pause_requested
        RETURNING id
    """


def checkpoint(
    *, run_id: UUID, owner: str, current_step: str, lease_until: datetime, write: StepWrite | None
) -> tuple[bool, bool]:
    """At a step boundary: store the previous step's result (if any) and check the lease.

    Returns (may_continue, written): may_continue is False when the lease is no longer this
    worker's, the run is not running, or a pause was asked; written is False when a final row was
    already stored for the previous step (another worker's).
    """
    extend_params = [_dt(lease_until), current_step, _id(run_id), owner]
    with connection.cursor() as cursor:
        if write is None:
            cursor.execute(_extend_sql(), extend_params)
            return cursor.fetchone() is not None, True
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""WITH stored AS ({upsert_sql()}), extended AS ({_extend_sql()})
                    SELECT (SELECT count(*) FROM extended), (SELECT count(*) FROM stored)""",
                upsert_params(write) + extend_params,
            )
            extended, stored = cursor.fetchone()
            return bool(extended), bool(stored)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(upsert_sql(), upsert_params(write))
        stored = cursor.fetchone() is not None
        cursor.execute(_extend_sql(), extend_params)
        return cursor.fetchone() is not None, stored


def finish(
    *, run: WorkflowRun, owner: str, now: datetime, write: StepWrite | None
) -> tuple[bool, bool]:
    """Write the run's end (status, result or error, attempt) and the last step's pending result.

    ``run`` carries the new status, result, error and failure_reason. Returns (finished, written);
    finished is False if the run was no longer this worker's to finish (its pending step result is
    stored all the same).
    """
    j = json_param()
    result = json.dumps(run.result) if run.result is not None else None
    error = json.dumps(run.error) if run.error is not None else None
    run_sql = f"""
        UPDATE {RUNS} SET status = %s, result = {j}, error = {j}, failure_reason = %s, finished_at = %s,
            updated_at = %s, lease_owner = '', lease_expires_at = NULL, current_step = '',
            wake_at = NULL, wait_step = '', wait_event_type = ''
        WHERE id = %s AND lease_owner = %s AND status = '{RunStatus.RUNNING}'
        RETURNING attempt
    """
    run_params = [run.status, result, error, run.failure_reason, _dt(now), _dt(now), _id(run.id), owner]
    attempt_sql = f"UPDATE {ATTEMPTS} SET status = %s, result = {j}, error = {j}, finished_at = %s " \
                  f"WHERE run_id = %s AND number = %s"
    attempt_params = [run.status, result, error, _dt(now), _id(run.id), run.attempt]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            stored_cte = f"stored AS ({upsert_sql()})," if write is not None else ""
            cursor.execute(
                f"""WITH {stored_cte} finished AS ({run_sql}),
                    attempt AS ({attempt_sql} AND EXISTS (SELECT 1 FROM finished) RETURNING 1)
                    SELECT (SELECT count(*) FROM finished), {'(SELECT count(*) FROM stored)' if write else '1'}""",
                (upsert_params(write) if write is not None else []) + run_params + attempt_params,
            )
            finished, stored = cursor.fetchone()
            return bool(finished), bool(stored)
    with transaction.atomic(), connection.cursor() as cursor:
        stored = True
        if write is not None:
            cursor.execute(upsert_sql(), upsert_params(write))
            stored = cursor.fetchone() is not None
        cursor.execute(run_sql, run_params)
        finished = cursor.fetchone() is not None
        if finished:
            cursor.execute(attempt_sql, attempt_params)
        return finished, stored
