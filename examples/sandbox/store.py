"""The sandbox provider's state in one SQLite file: refunds, armed faults and request counters.

SQLite rather than a lock and a JSON file: each change is one atomic, durable transaction (a
process killed mid-write leaves the previous state, never a half-written file), the UNIQUE key on
``refunds.key`` enforces "one refund per idempotency key" even if two server processes share the
file, and nothing rewrites the whole state on every request. Every operation opens its own
connection (the server runs a thread per request) and writes under ``BEGIN IMMEDIATE``, so the
check "does this key exist?" and the insert that follows cannot interleave with another writer.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypedDict

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
CREATE TABLE IF NOT EXISTS counters (
    kind TEXT NOT NULL,                -- 'request' (by outcome) or 'fault' (by fault kind)
    name TEXT NOT NULL,
    n    INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
);
"""

Target = Literal["create", "lookup"]
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


@dataclass(frozen=True)
class ArmedFault:
    key: str
    target: Target
    fault: str
    remaining: int

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "on": self.target, "fault": self.fault, "times": self.remaining}


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
        self, key: str, request: dict[str, Any], *, allowed: bool = True
    ) -> tuple[CreateOutcome, Refund | None]:
        """Create the refund for ``key`` once. Returns ("created", new), ("replayed", stored)
        when the stored request is the same, ("conflict", stored) when it differs, and
        ("declined", None) when nothing is stored for the key and ``allowed`` is false (the
        provider's rules refuse this refund: nothing is stored then either)."""
        canonical = json.dumps(request, sort_keys=True, separators=(",", ":"))
        with self._tx() as conn:
            row = conn.execute("SELECT request, body FROM refunds WHERE key = ?", (key,)).fetchone()
            if row is not None:
                stored: Refund = json.loads(row[1])
                return ("replayed" if row[0] == canonical else "conflict"), stored
            if not allowed:
                return "declined", None
            created_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            refund: Refund = {
                "id": "re_" + uuid.uuid4().hex[:24],
                "key": key,
                "status": "succeeded",
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
            return "created", refund

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
        requests = {name: n for kind, name, n in rows if kind == "request"}
        faults = {name: n for kind, name, n in rows if kind == "fault"}
        return {"refunds": refunds, "requests": requests, "faults": faults, "armed_faults": armed}

    def reset(self) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM refunds")
            conn.execute("DELETE FROM armed_faults")
            conn.execute("DELETE FROM counters")
