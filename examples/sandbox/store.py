"""The sandbox provider's state in one SQLite file: refunds, armed faults, request counters, refunds
waiting to settle, and the outbox of webhook events.

SQLite rather than a lock and a JSON file: each change is one atomic, durable transaction (a
process killed mid-write leaves the previous state, never a half-written file), the UNIQUE key on
``refunds.key`` enforces "one refund per idempotency key" even if two server processes share the
file, and nothing rewrites the whole state on every request. Every operation opens its own
connection (the server runs a thread per request) and writes under ``BEGIN IMMEDIATE``, so the
check "does this key exist?" and the insert that follows cannot interleave with another writer.

A refund's outcome event is queued in the transaction that stores (or settles) the refund, so an
outcome is never without its event, nor an event without its outcome, whatever is killed when; the
sender (``webhooks.py``) reads the outbox, so queued events are delivered after a restart too.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from examples.sandbox.faults import parse_webhook_fault

SCHEMA = """
CREATE TABLE IF NOT EXISTS refunds (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    key        TEXT NOT NULL UNIQUE,
    request    TEXT NOT NULL,          -- canonical JSON of the request body, for conflicts
    body       TEXT NOT NULL,          -- JSON of the refund as answered
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS armed_faults (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    key       TEXT NOT NULL,
    target    TEXT NOT NULL,           -- 'create' or 'lookup'
    fault     TEXT NOT NULL,
    remaining INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS armed_faults_key ON armed_faults (key, target, seq);
CREATE TABLE IF NOT EXISTS settlements (
    key    TEXT PRIMARY KEY,           -- a refund answered "pending", settled at due_at
    due_at REAL NOT NULL,              -- Unix time
    status TEXT NOT NULL               -- what it settles as: 'succeeded' or 'failed'
);
CREATE TABLE IF NOT EXISTS webhook_events (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,  -- webhook-id: the same on every attempt
    type            TEXT NOT NULL,         -- refund.succeeded or refund.failed
    key             TEXT NOT NULL,
    body            TEXT NOT NULL,         -- the exact bytes posted on every attempt
    status          TEXT NOT NULL,         -- held, queued, delivered, failed, dropped
    faults          TEXT NOT NULL,         -- the webhook faults it suffers, comma-separated
    burst           INTEGER,               -- reorder: released once this many events are held
    delay           REAL NOT NULL,         -- seconds added to when it would go
    copies          INTEGER NOT NULL,      -- 2 with the duplicate fault
    attempts        INTEGER NOT NULL DEFAULT 0,
    sends           INTEGER NOT NULL DEFAULT 0,  -- POSTs made, duplicates included
    rank            INTEGER,               -- due events go in this order (seq unless reordered)
    next_attempt_at REAL NOT NULL,         -- Unix time
    held_since      REAL,
    last_result     TEXT NOT NULL DEFAULT '',
    created_at      TEXT NOT NULL,
    delivered_at    TEXT
);
CREATE INDEX IF NOT EXISTS webhook_events_status ON webhook_events (status, next_attempt_at);
CREATE TABLE IF NOT EXISTS counters (
    kind TEXT NOT NULL,                -- 'request' (by outcome) or 'fault' (by fault kind)
    name TEXT NOT NULL,
    n    INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
);
"""

Target = Literal["create", "lookup", "webhook"]
EventStatus = Literal["held", "queued", "delivered", "failed", "dropped"]
EVENT_STATUSES: tuple[EventStatus, ...] = ("held", "queued", "delivered", "failed", "dropped")
CreateOutcome = Literal["created", "replayed", "conflict", "declined"]


class Refund(TypedDict):
    id: str
    key: str
    status: str
    order: str
    amount: str
    currency: str
    reason: str | None
    metadata: dict[str, str]
    created_at: str
    settled_at: NotRequired[str]
    failure_reason: NotRequired[str]


@dataclass(frozen=True)
class ArmedFault:
    key: str
    target: Target
    fault: str
    remaining: int

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "on": self.target, "fault": self.fault, "times": self.remaining}


@dataclass(frozen=True)
class WebhookEvent:
    """One event of the outbox, as the sender needs it."""

    seq: int
    id: str
    key: str
    body: bytes
    copies: int
    attempts: int


def _now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            # In WAL mode NORMAL survives a crash of this process (not of the machine); every
            # request writes counters, and a flush each would make the sandbox the bottleneck.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; _tx opens them explicitly.
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with closing(self._connect()) as conn:
            yield conn

    # -- refunds ----------------------------------------------------------------------------

    def create_refund(
        self,
        key: str,
        request: dict[str, Any],
        *,
        allowed: bool = True,
        settle_after: float | None = None,
        webhook_faults: tuple[str, ...] | None = None,
    ) -> tuple[CreateOutcome, Refund | None]:
        """Create the refund for ``key`` once. Returns ("created", new), ("replayed", stored)
        when the stored request is the same, ("conflict", stored) when it differs, and
        ("declined", None) when nothing is stored for the key and ``allowed`` is false (the
        provider's rules refuse this refund: nothing is stored then either).

        ``settle_after`` (seconds): the refund is stored ``pending`` and settles that much later,
        ``succeeded``, or ``failed`` (declined) where it is not ``allowed``: never "declined" then.
        ``webhook_faults``: None when no webhook is configured; otherwise the faults every event
        suffers, and the outcome's event is queued with the refund (at once, or when it settles)."""
        canonical = json.dumps(request, sort_keys=True, separators=(",", ":"))
        with self._tx() as conn:
            row = conn.execute("SELECT request, body FROM refunds WHERE key = ?", (key,)).fetchone()
            if row is not None:
                stored: Refund = json.loads(row[1])
                return ("replayed" if row[0] == canonical else "conflict"), stored
            if not allowed and settle_after is None:
                return "declined", None
            created_at = _now_text()
            refund: Refund = {
                "id": "re_" + uuid.uuid4().hex[:24],
                "key": key,
                "status": "succeeded" if settle_after is None else "pending",
                "order": request["order"],
                "amount": request["amount"],
                "currency": request["currency"],
                "reason": request.get("reason"),
                "metadata": request.get("metadata", {}),
                "created_at": created_at,
            }
            conn.execute(
                "INSERT INTO refunds (id, key, request, body, created_at) VALUES (?, ?, ?, ?, ?)",
                (refund["id"], key, canonical, json.dumps(refund), created_at),
            )
            if settle_after is not None:
                conn.execute(
                    "INSERT INTO settlements (key, due_at, status) VALUES (?, ?, ?)",
                    (key, time.time() + settle_after, "succeeded" if allowed else "failed"),
                )
            elif webhook_faults is not None:
                self._queue_event(conn, refund, webhook_faults)
            return "created", refund

    def settle_due(self, *, webhook_faults: tuple[str, ...] | None = None, now: float | None = None) -> int:
        """Settle the pending refunds whose time has come, each with its outcome's event (unless
        ``webhook_faults`` is None: no webhook configured); how many were settled."""
        now = time.time() if now is None else now
        with self._read() as conn:  # nearly always none: answer that without a write lock
            if conn.execute("SELECT 1 FROM settlements WHERE due_at <= ? LIMIT 1", (now,)).fetchone() is None:
                return 0
        with self._tx() as conn:
            due = conn.execute(
                "SELECT s.key, s.status, r.body FROM settlements s JOIN refunds r ON r.key = s.key "
                "WHERE s.due_at <= ? ORDER BY s.due_at, s.key",
                (now,),
            ).fetchall()
            for key, status, body in due:
                refund: Refund = json.loads(body)
                refund["status"] = status
                refund["settled_at"] = _now_text()
                if status == "failed":
                    refund["failure_reason"] = "declined"
                conn.execute("UPDATE refunds SET body = ? WHERE key = ?", (json.dumps(refund), key))
                conn.execute("DELETE FROM settlements WHERE key = ?", (key,))
                if webhook_faults is not None:
                    self._queue_event(conn, refund, webhook_faults)
            return len(due)

    def refund_by_key(self, key: str) -> Refund | None:
        with self._read() as conn:
            row = conn.execute("SELECT body FROM refunds WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def refunds_by_keys(self, keys: list[str]) -> dict[str, Refund]:
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT key, body FROM refunds WHERE key IN ({', '.join('?' * len(keys))})", keys
            ).fetchall()
        return {key: json.loads(body) for key, body in rows}

    def refunds(self) -> list[Refund]:
        with self._read() as conn:
            rows = conn.execute("SELECT body FROM refunds ORDER BY seq").fetchall()
        return [json.loads(body) for (body,) in rows]

    # -- armed faults -----------------------------------------------------------------------

    def arm(self, key: str, target: Target, fault: str, times: int) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO armed_faults (key, target, fault, remaining) VALUES (?, ?, ?, ?)",
                (key, target, fault, times),
            )

    def take_armed(self, key: str, target: Target) -> str | None:
        """The oldest fault armed for the next ``target`` request on ``key``, used up once."""
        with self._read() as conn:  # most requests have none: answer that without a write lock
            if (
                conn.execute(
                    "SELECT 1 FROM armed_faults WHERE key = ? AND target = ? LIMIT 1", (key, target)
                ).fetchone()
                is None
            ):
                return None
        with self._tx() as conn:
            row = conn.execute(
                "SELECT seq, fault, remaining FROM armed_faults WHERE key = ? AND target = ? ORDER BY seq LIMIT 1",
                (key, target),
            ).fetchone()
            if row is None:
                return None
            seq, fault, remaining = row
            if remaining <= 1:
                conn.execute("DELETE FROM armed_faults WHERE seq = ?", (seq,))
            else:
                conn.execute("UPDATE armed_faults SET remaining = remaining - 1 WHERE seq = ?", (seq,))
            return str(fault)

    def armed(self) -> list[ArmedFault]:
        with self._read() as conn:
            rows = conn.execute("SELECT key, target, fault, remaining FROM armed_faults ORDER BY seq").fetchall()
        return [ArmedFault(key, target, fault, remaining) for key, target, fault, remaining in rows]

    # -- the webhook outbox ------------------------------------------------------------------

    def _queue_event(self, conn: sqlite3.Connection, refund: Refund, default_faults: tuple[str, ...]) -> None:
        """Queue the refund's outcome event, in the caller's transaction. It suffers the default
        faults and every webhook fault armed for its key (each used once)."""
        armed = conn.execute(
            "SELECT seq, fault, remaining FROM armed_faults WHERE key = ? AND target = 'webhook' ORDER BY seq",
            (refund["key"],),
        ).fetchall()
        for seq, _fault, remaining in armed:
            if remaining <= 1:
                conn.execute("DELETE FROM armed_faults WHERE seq = ?", (seq,))
            else:
                conn.execute("UPDATE armed_faults SET remaining = remaining - 1 WHERE seq = ?", (seq,))
        faults = [parse_webhook_fault(text) for text in (*default_faults, *(fault for _, fault, _ in armed))]
        kinds = {fault.kind for fault in faults}
        bursts = [fault.burst for fault in faults if fault.kind == "reorder"]
        delay = sum(fault.value or 0.0 for fault in faults if fault.kind == "delay")
        status: EventStatus = "dropped" if "drop" in kinds else "held" if bursts else "queued"
        now = time.time()
        event_type = f"refund.{refund['status']}"
        body = json.dumps({"type": event_type, "timestamp": _now_text(), "data": refund}, separators=(",", ":"))
        (rank,) = conn.execute("SELECT COALESCE(MAX(rank), 0) + 1 FROM webhook_events").fetchone()
        conn.execute(
            "INSERT INTO webhook_events (id, type, key, body, status, faults, burst, delay, copies, rank, "
            "next_attempt_at, held_since, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "evt_" + uuid.uuid4().hex[:24],
                event_type,
                refund["key"],
                body,
                status,
                ",".join(str(fault) for fault in faults),
                min(bursts) if bursts else None,
                delay,
                2 if "duplicate" in kinds else 1,
                rank,
                now + delay,
                now if bursts else None,
                _now_text(),
            ),
        )

    def release_bursts(self, *, hold_seconds: float, now: float | None = None) -> int:
        """Release the held (reorder) events once there are as many as the smallest burst asked
        for, or the oldest has waited ``hold_seconds``: all of them, newest first, each after its
        delay. How many were released."""
        now = time.time() if now is None else now
        with self._read() as conn:
            row = conn.execute(
                "SELECT COUNT(*), MIN(burst), MIN(held_since) FROM webhook_events WHERE status = 'held'"
            ).fetchone()
        count, burst, oldest = row
        if count == 0 or (count < burst and now - oldest < hold_seconds):
            return 0
        with self._tx() as conn:
            held = conn.execute(
                "SELECT seq, delay FROM webhook_events WHERE status = 'held' ORDER BY seq DESC"
            ).fetchall()
            (rank,) = conn.execute("SELECT COALESCE(MAX(rank), 0) FROM webhook_events").fetchone()
            for offset, (seq, delay) in enumerate(held, start=1):
                conn.execute(
                    "UPDATE webhook_events SET status = 'queued', rank = ?, next_attempt_at = ? WHERE seq = ?",
                    (rank + offset, now + delay, seq),
                )
            return len(held)

    def due_events(self, *, limit: int = 100, now: float | None = None) -> list[WebhookEvent]:
        """Queued events whose time has come, in the order they are to be sent."""
        now = time.time() if now is None else now
        with self._read() as conn:
            rows = conn.execute(
                "SELECT seq, id, key, body, copies, attempts FROM webhook_events "
                "WHERE status = 'queued' AND next_attempt_at <= ? ORDER BY rank LIMIT ?",
                (now, limit),
            ).fetchall()
        return [
            WebhookEvent(seq, id_, key, body.encode(), copies, attempts)
            for seq, id_, key, body, copies, attempts in rows
        ]

    def record_attempt(self, seq: int, *, result: str, sends: int, delivered: bool, retry_at: float | None) -> None:
        """What one attempt came to: delivered; failed for good (``retry_at`` None); or to be
        tried again at ``retry_at``."""
        status: EventStatus = "delivered" if delivered else "failed" if retry_at is None else "queued"
        with self._tx() as conn:
            conn.execute(
                "UPDATE webhook_events SET attempts = attempts + 1, sends = sends + ?, last_result = ?, status = ?, "
                "next_attempt_at = COALESCE(?, next_attempt_at), delivered_at = ? WHERE seq = ?",
                (sends, result, status, retry_at, _now_text() if delivered else None, seq),
            )

    def webhook_events(self) -> list[dict[str, Any]]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT id, type, key, status, faults, attempts, sends, last_result, created_at, delivered_at "
                "FROM webhook_events ORDER BY seq"
            ).fetchall()
        names = ("id", "type", "key", "status", "faults", "attempts", "sends", "last_result", "created_at")
        return [{**dict(zip(names, row[:-1], strict=True)), "delivered_at": row[-1]} for row in rows]

    # -- counters ---------------------------------------------------------------------------

    def count(self, outcome: str, fault: str | None = None) -> None:
        with self._tx() as conn:
            sql = (
                "INSERT INTO counters (kind, name, n) VALUES (?, ?, 1) ON CONFLICT (kind, name) DO UPDATE SET n = n + 1"
            )
            conn.execute(sql, ("request", outcome))
            if fault is not None:
                conn.execute(sql, ("fault", fault))

    def stats(self) -> dict[str, Any]:
        with self._read() as conn:
            (refunds,) = conn.execute("SELECT COUNT(*) FROM refunds").fetchone()
            rows = conn.execute("SELECT kind, name, n FROM counters ORDER BY kind, name").fetchall()
            (armed,) = conn.execute("SELECT COALESCE(SUM(remaining), 0) FROM armed_faults").fetchone()
            (pending,) = conn.execute("SELECT COUNT(*) FROM settlements").fetchone()
            events = dict(conn.execute("SELECT status, COUNT(*) FROM webhook_events GROUP BY status").fetchall())
            (sends,) = conn.execute("SELECT COALESCE(SUM(sends), 0) FROM webhook_events").fetchone()
        requests = {name: n for kind, name, n in rows if kind == "request"}
        faults = {name: n for kind, name, n in rows if kind == "fault"}
        return {
            "refunds": refunds,
            "pending": pending,
            "requests": requests,
            "faults": faults,
            "armed_faults": armed,
            "webhooks": {status: events.get(status, 0) for status in EVENT_STATUSES},
            "webhook_sends": sends,
        }

    def reset(self) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM refunds")
            conn.execute("DELETE FROM armed_faults")
            conn.execute("DELETE FROM counters")
            conn.execute("DELETE FROM settlements")
            conn.execute("DELETE FROM webhook_events")
