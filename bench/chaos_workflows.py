"""What bench/chaos.py's workers and daphne load (``WORKFLOWS_MODULES`` and ``AGENTS_MODULES`` both
name this module): workflows and an agent whose step bodies count themselves.

Every body here calls ``record()`` first. It writes a row to ``chaos_exec`` on a connection of its
own in autocommit, outside the step's transaction: a body that ran but whose result was never
committed (its worker was killed, the database went away) is still counted. In the same statement
it asks whether the step's result was already stored as completed (``after_completed``): a body
that begins after its step's completion was committed is the thing the engine promises never
happens. An ``atomic=True`` body also writes a row to ``chaos_effect`` through Django's connection,
inside the step's transaction: it commits with the step's result or not at all, so a completed
atomic step has exactly one.

- ``chaos.mixed`` (public): a step, a step that fails its first try (retried), a sleep, an atomic
  write, optionally a wait for a ``chaos.go`` event (with a timeout), a slow step, an atomic finish.
- ``chaos.webhook``: what a signed ``chaos-events`` delivery starts (key ``chaos-events:<event id>``):
  a step and an atomic one.
- ``chaos.canary``: a step, a short sleep (a timer only beat's sweeper fires), a step: started by the
  campaign after each fault, its completion says the whole system works again.
- the agent ``chaos.chat``: each turn calls the tool ``chaos_lookup`` (database only, so atomic: it
  counts itself and writes one effect), then streams ``<n>`` numbered text deltas from the message
  ``go <n>``.

The tables are the campaign's (``TABLES``, created before any process starts).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg

from agents.providers.base import Finish, ModelEvent, ModelRequest, Provider, TextDelta, ToolCall
from agents.registry import ChatAgent, ToolContext, agent, tool
from workflows import Retries, WaitTimeout, Workflow, current_step, workflow
from workflows.registry import Event

GO_EVENT = "chaos.go"
KIND = "chaos.chat"
TABLES = """
CREATE TABLE IF NOT EXISTS chaos_exec (
    id bigserial PRIMARY KEY,
    run_id uuid NOT NULL,
    attempt integer NOT NULL,
    step text NOT NULL,
    after_completed boolean NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chaos_exec_step ON chaos_exec (run_id, attempt, step);
CREATE TABLE IF NOT EXISTS chaos_effect (
    id bigserial PRIMARY KEY,
    run_id uuid NOT NULL,
    attempt integer NOT NULL,
    step text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chaos_effect_step ON chaos_effect (run_id, attempt, step);
"""
RECORD = """
INSERT INTO chaos_exec (run_id, attempt, step, after_completed, pid)
SELECT %(run)s, %(attempt)s, %(step)s, EXISTS (
    SELECT 1 FROM workflows_stepresult
    WHERE run_id = %(run)s AND attempt = %(attempt)s AND name = %(step)s AND status = 'completed'
), %(pid)s
RETURNING (SELECT count(*) FROM chaos_exec WHERE run_id = %(run)s AND attempt = %(attempt)s AND step = %(step)s)
"""

_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0


def _connection() -> psycopg.Connection[Any]:
    """This process's own autocommit connection (a prefork child makes its own)."""
    global _conn, _conn_pid
    if _conn is None or _conn.closed or _conn_pid != os.getpid():
        from django.db import connection

        s = connection.settings_dict
        _conn = psycopg.connect(
            host=s["HOST"] or "127.0.0.1",
            port=s["PORT"] or 5432,
            dbname=s["NAME"],
            user=s["USER"] or "postgres",
            password=s["PASSWORD"] or None,
            autocommit=True,
            connect_timeout=3,
            application_name="chaos-record",
        )
        _conn_pid = os.getpid()
    return _conn


def record() -> int:
    """Count this body's execution, outside its step's transaction; returns how many times this
    step's body has begun (this one included). Waits out a database restart (up to a minute)."""
    global _conn
    context = current_step()
    assert context is not None, "record() is called in a step body"
    params = {"run": context.run_id, "attempt": context.attempt, "step": context.step, "pid": os.getpid()}
    deadline = time.monotonic() + 60
    while True:
        try:
            row = _connection().execute(RECORD, params).fetchone()
            return int(row[0]) + 1 if row else 1  # RETURNING's subquery sees the table before this row
        except psycopg.OperationalError:
            if _conn is not None:
                _conn.close()
            _conn = None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def effect() -> None:
    """One row in the step's own transaction (an ``atomic=True`` body)."""
    from django.db import connection

    context = current_step()
    assert context is not None and connection.in_atomic_block, "effect() is called in an atomic step body"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chaos_effect (run_id, attempt, step) VALUES (%s, %s, %s)",
            [context.run_id, context.attempt, context.step],
        )


# --- step bodies ---------------------------------------------------------------------------------
def plain(n: int) -> int:
    record()
    return n


def flaky(n: int) -> int:
    """Fails its first try (the engine retries it)."""
    if record() == 1:
        raise RuntimeError("chaos: the first try of this step always fails")
    return n


def write(n: int) -> int:
    record()
    effect()
    return n


def slow(seconds: float) -> float:
    """A body that takes a while: a window for a SIGKILL to land in."""
    record()
    time.sleep(seconds)
    return seconds


# --- workflows -----------------------------------------------------------------------------------
@workflow("chaos.mixed", public=True)
class Mixed(Workflow):
    def run(self, event: Event, step: Any) -> dict[str, Any]:
        n = int(event.payload.get("n", 0))
        step.do("prepare", plain, n)
        step.do("flaky", flaky, n, retries=Retries(limit=5, delay=timedelta(seconds=0.5), backoff="constant"))
        step.sleep("nap", float(event.payload.get("sleep", 1.0)))
        step.do("write", write, n, atomic=True)
        woken = False
        if event.payload.get("wait"):
            try:
                step.wait_for_event("go", type=GO_EVENT, timeout=float(event.payload.get("wait_timeout", 20)))
                woken = True
            except WaitTimeout:
                woken = False
        step.do("slow", slow, float(event.payload.get("slow", 0.5)))
        step.do("finish", write, n, atomic=True)
        return {"n": n, "woken": woken}


@workflow("chaos.webhook")
class WebhookEffect(Workflow):
    def run(self, event: Event, step: Any) -> int:
        n = int(event.payload.get("n", 0))
        step.do("receive", plain, n)
        step.do("apply", write, n, atomic=True)
        return n


@workflow("chaos.canary")
class Canary(Workflow):
    def run(self, event: Event, step: Any) -> bool:
        step.do("ping", plain, 0)
        step.sleep("tick", 0.2)
        step.do("pong", plain, 1)
        return True


# --- the agent -----------------------------------------------------------------------------------
@tool
def chaos_lookup(ctx: ToolContext, n: int) -> dict[str, Any]:
    """Look something up (the campaign's tool: it counts itself and writes one row).

    Args:
        n: A number.
    """
    record()
    effect()
    return {"n": n}


class ScriptedProvider:
    """Round 1: call ``chaos_lookup``. Round 2 (the tool answered): ``n`` numbered text deltas,
    ``"<i> "``, 40 ms apart; a recovered round continues after those already stored."""

    name = "chaos"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        users = [m for m in request.messages if m.role == "user"]
        words = users[-1].content.split() if users else []
        n = int(words[1]) if len(words) > 1 and words[1].isdigit() else 20
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user") if users else -1
        answered = any(m.role == "tool" for m in request.messages[last_user + 1 :])
        if not answered:
            yield ToolCall(id="call_1", name="chaos_lookup", arguments={"n": n})
            yield Finish("tool_calls")
            return
        done = request.prefix.count(" ")
        for i in range(done + 1, n + 1):
            time.sleep(0.04)
            yield TextDelta(f"{i} ")
        yield Finish("stop")


@agent(KIND)
class ChaosChat(ChatAgent):
    model = "chaos"
    system_prompt = "The fault campaign's model: a tool call, then numbered deltas."
    tools = (chaos_lookup,)

    def provider(self) -> Provider:
        return ScriptedProvider()
