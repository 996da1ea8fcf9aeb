"""The engine's hot statements, one database round trip and one commit each.

Each is a conditional write: it only takes effect for the worker that holds the run's lease and
while the run is ``running``, so it is safe against a concurrent terminate, restart or takeover
without a prior ``SELECT … FOR UPDATE``. On PostgreSQL the writes that belong together ride in one
statement (data-modifying CTEs); elsewhere (the SQLite demo) they run in one transaction.

The status they set follows the transitions declared on ``WorkflowRun``: ``claim`` is ``begin``
or ``wake``+``begin``, ``finish`` is ``complete`` or ``fail``, and the engine checks those
transitions on its in-memory run before calling ``finish``. The fields they write are the ones
those transitions set (the wait and lease fields from ``NO_WAIT`` and ``NO_LEASE`` themselves);
test_models holds the two alike.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

from workflows.conf import conf
from workflows.models import CLAIMABLE, NO_LEASE, NO_WAIT, TIMED, RunAttempt, RunStatus, WorkflowRun
from workflows.step_store import StepWrite, adapt, json_param, upsert_params, upsert_sql

M = TypeVar("M", bound=Model)

RUNS = WorkflowRun._meta.db_table
ATTEMPTS = RunAttempt._meta.db_table
RUN_COLUMNS = [str(f.column) for f in WorkflowRun._meta.concrete_fields]
RUN_ATTNAMES = [f.attname for f in WorkflowRun._meta.concrete_fields]


class _PreparedCursor:
    """A server-binding psycopg cursor that prepares what it runs, on Django's connection (so in
    Django's transaction). Kept for the life of the connection.

    A worker runs the same few statements on every step; planning them each time cost as much as
    running them. Django's own cursors stay as configured (client-side binding, nothing
    prepared), which keeps connection poolers and the ORM's SQL working as usual.
    """

    def __init__(self, db: BaseDatabaseWrapper) -> None:
        import psycopg

        raw = db.connection
        if raw.prepare_threshold is None:
            # Django turns preparing off for the connection; only cursors of this class ask
            # for it, and Django's client-side-binding cursors never prepare anyway.
            raw.prepare_threshold = 5
        self.raw, self.db = raw, db
        # Errors come out as Django's, and mark the connection as Django's cursors do, so it is
        # checked and replaced if broken before the worker's next task (close_old_connections).
        self._errors = db.wrap_database_errors
        self._cursor = psycopg.Cursor(raw)

    def __enter__(self) -> _PreparedCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, params: list[Any]) -> None:
        with self._errors:
            self._cursor.execute(sql, params, prepare=True)

    def fetchone(self) -> Any:
        with self._errors:
            return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self._errors:
            return self._cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount


_prepared = threading.local()


def _db() -> BaseDatabaseWrapper:
    """This thread's connection wrapper, looked up once per statement (each lookup of
    ``django.db.connection`` goes through a context-local proxy)."""
    return connections[DEFAULT_DB_ALIAS]


def _cursor(db: BaseDatabaseWrapper) -> Any:
    if db.vendor != "postgresql":
        return db.cursor()
    db.close_if_health_check_failed()  # as Django's cursors do: at most once per task or request
    db.ensure_connection()
    cursor = getattr(_prepared, "cursor", None)
    # A new one for another connection, or for another wrapper around one (an ASGI server's pool
    # lends a connection to whichever thread asks): errors mark the wrapper that runs the statement.
    if cursor is None or cursor.raw is not db.connection or cursor.db is not db:
        cursor = _prepared.cursor = _PreparedCursor(db)
    return cursor


def prepared_cursor() -> Any:
    """This thread's cursor for another app's hot statement, in Django's transaction: on PostgreSQL
    the one that prepares what it runs, elsewhere one of Django's. Use it as a context manager."""
    return _cursor(_db())


def insert_instance(obj: Model, *, on_conflict: str = "") -> bool:
    """INSERT ``obj`` as ``save(force_insert=True)`` would write it (defaults, ``auto_now_add``; an
    id the database makes read back), in one statement, prepared on PostgreSQL. ``on_conflict``:
    what follows ON CONFLICT (``"(a, b) DO NOTHING"``); False, nothing stored, if it did nothing.
    Sends no model signals (nothing here listens to the models it is used for)."""
    db = _db()
    pk = type(obj)._meta.pk
    with _cursor(db) as cursor:
        cursor.execute(_insert_sql(type(obj), on_conflict), insert_values(db, obj, _fields(type(obj))))
        if pk is not None and _db_generated(pk):
            row = cursor.fetchone()
            if row is None:
                return False
            setattr(obj, pk.attname, row[0])
        elif cursor.rowcount != 1:
            return False
    obj._state.adding, obj._state.db = False, db.alias
    return True


@functools.cache
def _insert_sql(model: type[Model], on_conflict: str) -> str:
    fields = _fields(model)
    pk = model._meta.pk
    conflict = f" ON CONFLICT {on_conflict}" if on_conflict else ""
    returning = f" RETURNING {pk.column}" if pk is not None and _db_generated(pk) else ""
    placeholders = ", ".join(["%s"] * len(fields))
    return f"INSERT INTO {model._meta.db_table} ({_columns(fields)}) VALUES ({placeholders}){conflict}{returning}"


def update_instance(obj: Model, names: tuple[str, ...]) -> None:
    """UPDATE the fields ``names`` of ``obj``'s row to their values in memory, as
    ``save(update_fields=names)`` would write them, in one statement, prepared on PostgreSQL;
    DatabaseError if the row is not there, as that save raises."""
    db = _db()
    fields = [f for f in type(obj)._meta.concrete_fields if f.name in names]
    with _cursor(db) as cursor:
        cursor.execute(
            _update_sql(type(obj), names),
            [*(_db_value(db, f, getattr(obj, f.attname)) for f in fields), _db_value(db, type(obj)._meta.pk, obj.pk)],
        )
        if cursor.rowcount != 1:
            raise DatabaseError(f"{type(obj).__name__} {obj.pk} is not there to update")


@functools.cache
def _update_sql(model: type[Model], names: tuple[str, ...]) -> str:
    assignments = ", ".join(f"{f.column} = %s" for f in model._meta.concrete_fields if f.name in names)
    return f"UPDATE {model._meta.db_table} SET {assignments} WHERE {model._meta.pk.column} = %s"


def _db_value(db: BaseDatabaseWrapper, field: Any, value: Any) -> Any:
    return field.get_db_prep_save(value, connection=db)


def _in(values: list[RunStatus]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _set(values: Mapping[str, Any]) -> str:
    """``column = value, ...`` for WorkflowRun fields set to constants (None or a plain string)."""

    def literal(value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, str) and "'" not in value:
            return f"'{value}'"
        raise ValueError(f"not a constant this SQL writes: {value!r}")

    column = dict(zip(RUN_ATTNAMES, RUN_COLUMNS, strict=True))
    return ", ".join(f"{column[name]} = {literal(value)}" for name, value in values.items())


@functools.cache
def _sql(vendor: str) -> dict[str, str]:
    """The statements, built once per database vendor."""
    j = json_param(vendor)
    extend = f"""
        UPDATE {RUNS} SET lease_expires_at = %s, current_step = %s
        WHERE id = %s AND lease_owner = %s AND status = '{RunStatus.RUNNING}' AND NOT pause_requested
        RETURNING id
    """
    finish = f"""
        UPDATE {RUNS} SET status = %s, result = {j}, error = {j}, failure_reason = %s, finished_at = %s,
            updated_at = %s, {_set(NO_LEASE)}, {_set(NO_WAIT)}
        WHERE id = %s AND lease_owner = %s AND status = '{RunStatus.RUNNING}'
        RETURNING attempt
    """
    attempt = (
        f"UPDATE {ATTEMPTS} SET status = %s, result = {j}, error = {j}, finished_at = %s "
        f"WHERE run_id = %s AND number = %s"
    )
    return {
        "claim": f"""
            UPDATE {RUNS} SET
                status = '{RunStatus.RUNNING}', lease_owner = %s, lease_expires_at = %s,
                recovery_count = CASE WHEN lease_owner <> '' THEN recovery_count + 1 ELSE recovery_count END,
                started_at = COALESCE(started_at, %s), updated_at = %s, {_set(NO_WAIT)}
            WHERE id = %s
              AND (lease_expires_at IS NULL OR lease_expires_at < %s)
              AND (status IN ({_in(CLAIMABLE)}) OR (status IN ({_in(TIMED)}) AND wake_at <= %s))
            RETURNING {", ".join(RUN_COLUMNS)}
        """
        # The subquery reads the row as the statement's snapshot had it, before this UPDATE (the
        # new version is invisible to the statement that wrote it): did a lease still name an
        # owner, that is, is this claim a recovery? Only metrics and logs read it; SQLite (the demo)
        # would see the new row, so it asks with a SELECT of its own first (claim_run).
        + (f", (SELECT lease_owner <> '' FROM {RUNS} WHERE id = %s)" if vendor == "postgresql" else ""),
        "extend": extend,
        # A boundary with no result to store: the lease and the step's name are all it writes, and a
        # PostgreSQL crash that lost them loses nothing a run needs (a shorter lease is recovered
        # like any lost one), so its commit does not wait for the WAL flush. The next commit that
        # does wait flushes it too, in order.
        "extend_async": f"""
            WITH extended AS ({extend}),
                 async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
            SELECT (SELECT count(*) FROM extended), (SELECT count(*) FROM async_commit)
        """,
        "upsert": upsert_sql(vendor),
        "store_and_extend": f"""
            WITH stored AS ({upsert_sql(vendor)}), extended AS ({extend})
            SELECT (SELECT count(*) FROM extended), (SELECT count(*) FROM stored)
        """,
        # WORKFLOWS_STEP_COMMIT=async: this statement's commit does not wait for the WAL flush.
        "store_and_extend_async": f"""
            WITH stored AS ({upsert_sql(vendor)}), extended AS ({extend}),
                 async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
            SELECT (SELECT count(*) FROM extended), (SELECT count(*) FROM stored),
                   (SELECT count(*) FROM async_commit)
        """,
        "finish": finish,
        "attempt": attempt,
        "finish_all": f"""
            WITH finished AS ({finish}),
                 attempt AS ({attempt} AND EXISTS (SELECT 1 FROM finished) RETURNING 1)
            SELECT (SELECT count(*) FROM finished), 1
        """,
        "store_and_finish_all": f"""
            WITH stored AS ({upsert_sql(vendor)}), finished AS ({finish}),
                 attempt AS ({attempt} AND EXISTS (SELECT 1 FROM finished) RETURNING 1)
            SELECT (SELECT count(*) FROM finished), (SELECT count(*) FROM stored)
        """,
    }


def _fields(model: type[Any]) -> list[Any]:
    """The fields an insert of ``model`` writes: every concrete one but an id the database makes."""
    return [f for f in model._meta.concrete_fields if not (f.primary_key and _db_generated(f))]


def _db_generated(field: Any) -> bool:
    """An auto id, declared or implicit (``AutoField``s return their value from an INSERT)."""
    return bool(getattr(field, "db_returning", False))


def _columns(fields: list[Any]) -> str:
    return ", ".join(str(f.column) for f in fields)


def insert_values(db: BaseDatabaseWrapper, obj: Any, fields: list[Any]) -> list[Any]:
    """The fields' values as Django's own insert writes them (defaults, ``auto_now_add``)."""
    return [_db_value(db, f, f.pre_save(obj, True)) for f in fields]


RUN_FIELDS, ATTEMPT_FIELDS = _fields(WorkflowRun), _fields(RunAttempt)


def _start_sql(db: BaseDatabaseWrapper) -> str:
    """A new run and its first attempt, unless a run already has its idempotency key: then neither.
    (The attempt's values are a SELECT's, typed: only an INSERT's VALUES take their columns' types.)"""
    if (sql := _START_SQL.get(db.vendor)) is None:
        sql = _START_SQL[db.vendor] = _start_sql_for(db)
    return sql


_START_SQL: dict[str, str] = {}


def _start_sql_for(db: BaseDatabaseWrapper) -> str:
    typed = ", ".join(f"%s::{f.db_type(db)}" for f in ATTEMPT_FIELDS)
    return f"""
        WITH run AS (
            INSERT INTO {RUNS} ({_columns(RUN_FIELDS)}) VALUES ({", ".join(["%s"] * len(RUN_FIELDS))})
            ON CONFLICT (dedupe_key) DO NOTHING RETURNING id
        ), attempt AS (
            INSERT INTO {ATTEMPTS} ({_columns(ATTEMPT_FIELDS)})
            SELECT {typed} WHERE EXISTS (SELECT 1 FROM run) RETURNING 1
        )
        SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM attempt)
    """


def insert_run(run: WorkflowRun, attempt: RunAttempt) -> bool:
    """Store a new ``run`` and its first ``attempt`` (inside atomic()); False, storing neither, if a
    run with the same ``dedupe_key`` exists (one a concurrent start is inserting is waited for).

    One statement, where Django's ``create`` of each and the savepoint a possible conflict needs
    made four round trips; every run starts here (an API start, a webhook, a schedule, a chat turn).
    Every field is written as Django writes it, defaults included."""
    db = _db()
    if db.vendor != "postgresql":
        if run.dedupe_key is not None and WorkflowRun.objects.filter(dedupe_key=run.dedupe_key).exists():
            return False  # the SQLite demo: one writer at a time
        run.save(force_insert=True)
        attempt.save(force_insert=True)
        return True
    with _cursor(db) as cursor:
        cursor.execute(_start_sql(db), insert_values(db, run, RUN_FIELDS) + insert_values(db, attempt, ATTEMPT_FIELDS))
        inserted = bool(cursor.fetchone()[0])
    if inserted:
        for obj in (run, attempt):
            obj._state.adding, obj._state.db = False, db.alias
    return inserted


@functools.cache
def _token_sql() -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    tokens, users = Token._meta.db_table, get_user_model()._meta.db_table
    columns = [f"t.{f.column}" for f in Token._meta.concrete_fields]
    columns += [f"u.{f.column}" for f in get_user_model()._meta.concrete_fields]
    return f"SELECT {', '.join(columns)} FROM {tokens} t INNER JOIN {users} u ON u.id = t.user_id WHERE t.key = %s"


def token_with_user(key: str) -> tuple[Any, Any] | None:
    """The API token ``key`` and its user (DRF's authtoken), as ``Token.objects.select_related(
    "user").get(key=key)`` reads them, in one prepared statement; None if there is no such token."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    db = _db()
    if db.vendor != "postgresql":
        token = Token.objects.select_related("user").filter(key=key).first()
        return None if token is None else (token, token.user)
    with _cursor(db) as cursor:
        cursor.execute(_token_sql(), [key])
        row = cursor.fetchone()
    if row is None:
        return None
    split = len(Token._meta.concrete_fields)
    token, user = instance_from_row(db, Token, row[:split]), instance_from_row(db, get_user_model(), row[split:])
    token.user = user
    return token, user


def claim(run_id: UUID | str, owner: str, now: datetime, lease_until: datetime) -> WorkflowRun | None:
    """Take the lease of a run that is ready to advance and free; the claimed row, or None.

    A lease that expired while still naming an owner means that worker died mid-run: the claim
    counts one recovery.
    """
    claimed = claim_run(run_id, owner, now, lease_until)
    return claimed[0] if claimed is not None else None


def claim_run(run_id: UUID | str, owner: str, now: datetime, lease_until: datetime) -> tuple[WorkflowRun, bool] | None:
    """``claim``, and whether the claim was a recovery (it took over a dead worker's lease)."""
    db = _db()
    run_id = run_id if isinstance(run_id, UUID) else UUID(run_id)
    n, u, key = adapt(db, now), adapt(db, lease_until), adapt(db, run_id)
    params = [owner, u, n, n, key, n, n]
    with _cursor(db) as cursor:
        if db.vendor == "postgresql":
            cursor.execute(_sql(db.vendor)["claim"], [*params, key])
            row = cursor.fetchone()
            if row is None:
                return None
            *row, recovered = row
        else:
            cursor.execute(f"SELECT lease_owner FROM {RUNS} WHERE id = %s", [key])
            before = cursor.fetchone()
            recovered = before is not None and before[0] != ""
            cursor.execute(_sql(db.vendor)["claim"], params)
            row = cursor.fetchone()
            if row is None:
                return None
    return instance_from_row(db, WorkflowRun, row), bool(recovered)


def instance_from_row(db: BaseDatabaseWrapper, model: type[M], row: Any) -> M:
    """An instance of ``model`` from a raw statement's row of its concrete fields, in their order.

    Through the backend's converters and the fields' own, as a queryset would: SQLite returns text
    for a UUID or a datetime, and PostgreSQL a JSON column's text, which only those turn back."""
    fields = model._meta.concrete_fields
    values = [value_from_db(db, field, value) for field, value in zip(fields, row, strict=True)]
    return model.from_db(db.alias, [f.attname for f in fields], values)


def value_from_db(db: BaseDatabaseWrapper, field: Any, value: Any) -> Any:
    """A raw statement's value of ``field``'s column as a queryset gives it (see instance_from_row)."""
    col, converters = _converters(db, field)
    for converter in converters:
        value = converter(value, col, db)
    return value


def _converters(db: BaseDatabaseWrapper, field: Any) -> tuple[Any, list[Any]]:
    """The connection's converters for ``field``, found once: asking the backend and the field for
    them cost more than converting (every hot read comes through here, a token's, an agent's, a
    run's). Kept on the connection's wrapper, and gone with it: SQLite's are methods of the
    wrapper's own, which a cache outside it would keep alive."""
    known: dict[Any, tuple[Any, list[Any]]] = db.__dict__.setdefault("_statement_converters", {})
    found = known.get(field)
    if found is None:
        col = field.get_col(field.model._meta.db_table)
        found = known[field] = (col, [*db.ops.get_db_converters(col), *field.get_db_converters(db)])
    return found


def checkpoint(
    *, run_id: UUID, owner: str, current_step: str, lease_until: datetime, write: StepWrite | None
) -> tuple[bool, bool]:
    """At a step boundary: store the previous step's result (if any) and check the lease.

    Returns (may_continue, written): may_continue is False when the lease is no longer this
    worker's, the run is not running, or a pause was asked; written is False when a final row was
    already stored for the previous step (another worker's).
    """
    db = _db()
    sql = _sql(db.vendor)
    extend_params = [adapt(db, lease_until), current_step, adapt(db, run_id), owner]
    if write is None:
        with _cursor(db) as cursor:
            # Not inside a transaction of the caller's: the setting would last to its commit.
            if db.vendor == "postgresql" and not db.in_atomic_block:
                cursor.execute(sql["extend_async"], extend_params)
                return bool(cursor.fetchone()[0]), True
            cursor.execute(sql["extend"], extend_params)
            return cursor.fetchone() is not None, True
    if db.vendor == "postgresql":
        statement = "store_and_extend_async" if conf()["STEP_COMMIT"] == "async" else "store_and_extend"
        with _cursor(db) as cursor:
            cursor.execute(sql[statement], upsert_params(write, db) + extend_params)
            extended, stored = cursor.fetchone()[:2]
            return bool(extended), bool(stored)
    with transaction.atomic(), _cursor(db) as cursor:
        cursor.execute(sql["upsert"], upsert_params(write, db))
        stored = cursor.fetchone() is not None
        cursor.execute(sql["extend"], extend_params)
        return cursor.fetchone() is not None, stored


def finish(*, run: WorkflowRun, owner: str, now: datetime, write: StepWrite | None) -> tuple[bool, bool]:
    """Write the run's end (status, result or error, attempt) and the last step's pending result.

    ``run`` carries the new status, result, error and failure_reason. Returns (finished, written);
    finished is False if the run was no longer this worker's to finish (its pending step result is
    stored all the same).
    """
    db = _db()
    sql = _sql(db.vendor)
    result = json.dumps(run.result) if run.result is not None else None
    error = json.dumps(run.error) if run.error is not None else None
    n, run_id = adapt(db, now), adapt(db, run.id)
    run_params = [run.status, result, error, run.failure_reason, n, n, run_id, owner]
    attempt_params = [run.status, result, error, n, run_id, run.attempt]
    if db.vendor == "postgresql":
        with _cursor(db) as cursor:
            if write is None:
                cursor.execute(sql["finish_all"], run_params + attempt_params)
            else:
                cursor.execute(sql["store_and_finish_all"], upsert_params(write, db) + run_params + attempt_params)
            finished, stored = cursor.fetchone()
            return bool(finished), bool(stored)
    with transaction.atomic(), _cursor(db) as cursor:
        stored = True
        if write is not None:
            cursor.execute(sql["upsert"], upsert_params(write, db))
            stored = cursor.fetchone() is not None
        cursor.execute(sql["finish"], run_params)
        finished = cursor.fetchone() is not None
        if finished:
            cursor.execute(sql["attempt"], attempt_params)
        return finished, stored
