"""Writing a turn's stream: chunks stored in batches, fenced by the run's lease, then published.

A model step yields a chunk per token or so; a commit per chunk would make the database the
bottleneck. ``ChunkWriter`` buffers them and stores a batch with one INSERT when it holds
``AGENTS_CHUNK_FLUSH_COUNT`` chunks, when ``AGENTS_CHUNK_FLUSH_MS`` have passed since the last
batch began to be stored or the writer started (so a slow model's chunks go out one by one, at
once, however long a batch's commit takes), and when the step ends (``close``). A batch is one INSERT whatever its
size: its rows travel as one JSON parameter, so the statement's text is the same every time.

Each INSERT is fenced: it writes only while the run's row says this worker holds the lease (the
owner matches, the lease has not expired, the run is ``running``), and it takes a share lock on
that row, so a terminate or a takeover committed first makes it write nothing, and one that comes
later waits for it. A writer fenced out raises ``FencedOut``, which ends the step: a worker that
lost its run can never add to the turn's stream. ``seq`` continues from the highest stored one,
read when the writer starts (nobody else writes a running turn's chunks: only the lease holder).

A chunk with a ``key`` is stored once whatever retries (a tool call's output): it goes in a batch
of its own, ``ON CONFLICT DO NOTHING``, and if it was there already it takes no ``seq``.

Every stored batch is pushed after its commit as one ``agent.chunks`` message (``streams``).
"""

from __future__ import annotations

import json
import time
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, Exists, Max
from django.db.models.expressions import RawSQL
from django.utils import timezone

from agents import streams
from agents.models import Chunk, Turn
from workflows.models import RunStatus, WorkflowRun

CHUNKS = Chunk._meta.db_table
RUNS = WorkflowRun._meta.db_table


class FencedOut(Exception):
    """The run's lease is no longer this worker's: the chunk was not stored, and the step must stop."""


def dumps(data: Any) -> str:
    return json.dumps(data, cls=DjangoJSONEncoder, allow_nan=False)


def last_seq(turn_id: UUID | str) -> int:
    return int(Chunk.objects.filter(turn_id=turn_id).aggregate(m=Max("seq"))["m"] or 0)


def fenced_sql() -> str:
    return (
        f"EXISTS (SELECT 1 FROM {RUNS} WHERE id = %s AND lease_owner = %s AND lease_owner <> '' "
        f"AND lease_expires_at > now() AND status = '{RunStatus.RUNNING}' FOR SHARE)"
    )


def fence(run_id: UUID, owner: str) -> None:
    """Share-lock the run's row if this worker holds its lease, else raise FencedOut (inside an
    atomic block: the lock lasts until its commit, so nobody terminates the run meanwhile)."""
    if not _postgresql():
        if not _holds_lease(run_id, owner):
            raise FencedOut(f"run {run_id}: the lease is not {owner!r}'s")
        return
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {fenced_sql()}", [run_id, owner])
        row = cursor.fetchone()
    if not (row and row[0]):
        raise FencedOut(f"run {run_id}: the lease is not {owner!r}'s")


def fenced(run_id: UUID, owner: str) -> Exists | RawSQL:
    """The fence as a filter for another query: its rows exist only while this worker holds the run's
    lease, and on PostgreSQL the run's row is share-locked first (before any row the query locks)."""
    if not _postgresql():
        return Exists(
            WorkflowRun.objects.filter(
                pk=run_id, lease_owner=owner, lease_expires_at__gt=timezone.now(), status=RunStatus.RUNNING
            ).exclude(lease_owner="")
        )
    return RawSQL(fenced_sql(), [run_id, owner], output_field=BooleanField())


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


def _holds_lease(run_id: UUID, owner: str) -> bool:
    """The fence as an ORM query, for the SQLite demo (one writer at a time: nothing to lock)."""
    return (
        WorkflowRun.objects.filter(
            pk=run_id, lease_owner=owner, lease_expires_at__gt=timezone.now(), status=RunStatus.RUNNING
        )
        .exclude(lease_owner="")
        .exists()
    )


class ChunkWriter:
    """The stream of one turn, written by the worker holding its run's lease (``owner``)."""

    def __init__(self, *, turn: Turn, run_id: UUID, owner: str, seq: int | None = None) -> None:
        self.turn = turn
        self.turn_id: UUID = turn.pk
        self.run_id = run_id
        self.owner = owner
        # The last stored seq (the next chunk is seq + 1), unless the caller read it with the turn.
        self.seq = last_seq(self.turn_id) if seq is None else seq
        self._buffer: list[tuple[str, Any]] = []
        # The writer's start counts as a batch: the first chunk of a model that takes longer than
        # the interval to begin (any model behind a network) goes out at once, and an answer given
        # whole within it (a rules model, a cache) is stored in the round's last batch (with the
        # turn's end when the round answers) instead of one transaction early.
        self._last_flush = time.monotonic()
        self.flush_count = int(settings.AGENTS_CHUNK_FLUSH_COUNT)
        self.flush_seconds = float(settings.AGENTS_CHUNK_FLUSH_MS) / 1000

    def add(self, type_: str, data: Any, *, hold: bool = False) -> None:
        """Buffer a chunk; store the buffer if it is full or the last batch is old enough, unless
        ``hold``: then it goes with the next chunk's batch (a turn's ``start`` with its first delta)."""
        self._buffer.append((type_, data))
        if hold:
            return
        if len(self._buffer) >= self.flush_count or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def add_once(self, type_: str, data: Any, *, key: str) -> bool:
        """Store a chunk that exists once per turn and ``key``, now; False if it was stored already."""
        self.flush()
        return bool(self._insert([(type_, data)], key=key))

    def flush(self) -> None:
        # From the start: a chunk that comes one interval after the last, and a commit that took
        # part of that interval, must not wait for the chunk after it.
        started = time.monotonic()
        if self._buffer:
            batch, self._buffer = self._buffer, []
            self._insert(batch)
        self._last_flush = started

    close = flush

    def _insert(self, batch: list[tuple[str, Any]], *, key: str = "") -> int:
        first = self.seq + 1
        rows = dumps([streams.chunk_data(first + i, type_, data) for i, (type_, data) in enumerate(batch)])
        conflict = "ON CONFLICT (turn_id, key) WHERE NOT (key = '') DO NOTHING" if key else ""
        sql = (
            f"INSERT INTO {CHUNKS} (turn_id, seq, type, data, key, created_at) "
            f"SELECT %s::uuid, v.seq, v.type, v.data, %s, now() "
            f"FROM jsonb_to_recordset(%s::jsonb) AS v(seq integer, type text, data jsonb) "
            f"WHERE {fenced_sql()} {conflict} RETURNING seq"
        )
        params: list[Any] = [self.turn_id, key, rows, self.run_id, self.owner]
        try:
            if _postgresql():
                # Inside a step's own transaction (a turn's end) no savepoint: a failure raises and
                # rolls that back whole.
                with transaction.atomic(savepoint=False), connection.cursor() as cursor:
                    cursor.execute(sql, params)
                    written = len(cursor.fetchall())
            else:
                written = self._insert_portable(rows, key=key)
        except IntegrityError as exc:
            # The seq was taken: someone else wrote this turn's stream (a stop, a worker that took
            # the run over). Either way this writer is no longer the stream's.
            raise FencedOut(f"turn {self.turn_id}: seq {first} is taken") from exc
        if written == 0:
            if key and Chunk.objects.filter(turn_id=self.turn_id, key=key).exists():
                return 0
            raise FencedOut(f"run {self.run_id}: the lease is not {self.owner!r}'s; chunks not stored")
        self.seq += written
        chunks = json.loads(rows)  # what was stored, as the JSON a client gets
        streams.push_later(self.turn.agent_id, streams.chunks_message(self.turn, chunks))
        return written

    def _insert_portable(self, rows: str, *, key: str) -> int:
        """The fenced INSERT as ORM writes in one transaction, for the SQLite demo."""
        with transaction.atomic():
            if not _holds_lease(self.run_id, self.owner):
                return 0
            if key and Chunk.objects.filter(turn_id=self.turn_id, key=key).exists():
                return 0
            Chunk.objects.bulk_create(
                Chunk(turn_id=self.turn_id, seq=c["seq"], type=c["type"], data=c["data"], key=key)
                for c in json.loads(rows)
            )
        return len(json.loads(rows))


def append_unfenced(*, turn: Turn, type_: str, data: Any) -> int:
    """Store one chunk for a service that ends a turn from outside its run (a stop): call inside
    atomic() with the turn's run row locked (or no run), so no lease holder writes meanwhile.
    Returns its seq."""
    seq = last_seq(turn.pk) + 1
    Chunk.objects.create(turn=turn, seq=seq, type=type_, data=json.loads(dumps(data)))
    streams.push_later(turn.agent_id, streams.chunks_message(turn, [streams.chunk_data(seq, type_, data)]))
    return seq
