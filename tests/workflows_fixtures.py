"""Workflows the test suite runs in real worker processes (loaded through WORKFLOWS_MODULES).

Step bodies append to files named in the payload, so a test in another process can see exactly
which bodies ran and how often.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from workflows import NonRetryableError, Retries, StepError, WaitTimeout, Workflow, workflow
from workflows.registry import Event


def append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines() if os.path.exists(path) else []


def write_line(path: str, i: int, slow_step: int | None = None, slow_seconds: float = 0) -> int:
    append(path, str(i))
    if i == slow_step:
        time.sleep(slow_seconds)
    return i


@workflow("test.lines")
class Lines(Workflow):
    def run(self, event: Event, step: Any) -> list[int]:
        p = event.payload
        return [
            step.do(f"step {i}", write_line, p["path"], i, p.get("slow_step"), p.get("slow_seconds", 0))
            for i in range(p["steps"])
        ]


def flaky(path: str, fail_times: int, non_retryable: bool) -> str:
    append(path, f"try {time.time():.3f}")
    if len(lines(path)) <= fail_times:
        if non_retryable:
            raise NonRetryableError("the card was declined")
        raise ValueError(f"failure {len(lines(path))}")
    return "ok"


@workflow("test.flaky")
class Flaky(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        retries = Retries(
            limit=p.get("limit", 3), delay=timedelta(seconds=p.get("delay", 0.2)), backoff=p.get("backoff", "constant")
        )
        try:
            return step.do("flaky", flaky, p["path"], p["fail_times"], p.get("non_retryable", False), retries=retries)
        except StepError as exc:
            if p.get("catch"):
                return {"caught": exc.error_type, "message": exc.message}
            raise


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


@workflow("test.timeout")
class Timeout(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        return step.do(
            "slow", slow, event.payload["seconds"], timeout=event.payload["timeout"], retries=Retries(limit=0)
        )


@workflow("test.sleep")
class Sleep(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        before = step.do("before", time.time)
        step.sleep("nap", timedelta(seconds=event.payload.get("seconds", 1)))
        after = step.do("after", time.time)
        return {"slept": after - before}


def mark(path: str, line: str) -> float:
    append(path, line)
    return time.time()


@workflow("test.sleep_until")
class SleepUntil(Workflow):
    """Sleeps until the time in the payload (ISO 8601), between two steps that write to ``path``;
    then naps ``nap`` seconds, so that the run replays once more through the finished sleep."""

    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        before = step.do("before", mark, p["path"], "before")
        step.sleep_until("until", datetime.fromisoformat(p["until"]))
        step.sleep("nap", timedelta(seconds=p.get("nap", 0)))
        after = step.do("after", mark, p["path"], "after")
        return {"before": before, "after": after}


@workflow("test.wait", public=True)
class Wait(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        try:
            reply = step.wait_for_event("wait for reply", type="reply", timeout=event.payload.get("timeout", 30))
        except WaitTimeout:
            return {"timed_out": True}
        after = step.do("after", time.time)
        return {"reply": reply, "after": after}


def name_flag(path: str) -> str:
    return "second name" if os.path.exists(path) else "first name"


@workflow("test.nondeterminism")
class NonDeterministic(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        step.do(name_flag(p["flag"]), time.time)  # a name read outside a step: not deterministic
        step.sleep("pause", timedelta(seconds=p.get("seconds", 0.5)))
        return "done"


def create_group(name: str, path: str, hold: float) -> int:
    from django.contrib.auth.models import Group

    group = Group.objects.create(name=name)
    append(path, "inside")
    time.sleep(hold)
    return group.pk


@workflow("test.atomic")
class Atomic(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        return step.do("create group", create_group, p["group"], p["path"], p.get("hold", 0), atomic=True)


def kill_own_worker(path: str) -> None:
    append(path, "kill")
    os.kill(os.getpid(), signal.SIGKILL)


@workflow("test.poison")
class Poison(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        step.do("kill the worker", kill_own_worker, event.payload["path"])
        return "unreachable"


@workflow("test.progress_rests")
class ProgressRests(Workflow):
    """Reports its progress and broadcasts between steps, resting (suspended) after each: each
    resume replays the reports before it."""

    def run(self, event: Event, step: Any) -> Any:
        for i in range(3):
            step.do(f"work {i}", slow, 0.01)
            self.report_progress({"done": i + 1})
            self.broadcast({"done": i + 1})
            step.sleep(f"rest {i}", 0.2)
        return "rested"


@workflow("test.progress")
class Progress(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        total = event.payload.get("steps", 5)
        for i in range(total):
            step.do(f"work {i}", slow, event.payload.get("seconds", 0.1))
            self.report_progress({"done": i + 1, "total": total})
        return total


@workflow("test.dispatch")
class Dispatch(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        first = step.do("local", write_line, p["path"], 0)
        second = step.do("elsewhere", write_line, p["path"], 1, queue=p["queue"])
        return [first, second]


@workflow("test.echo", public=True)
class Echo(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        return step.do("echo", dict, event.payload)


@workflow("test.big")
class Big(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        try:
            step.do("too big", lambda: "x" * (2 * 1024 * 1024))
        except StepError as exc:
            too_big = exc.message
        try:
            step.do("not json", lambda: {1, 2, 3})
        except StepError as exc:
            not_json = exc.message
        return {"too_big": too_big, "not_json": not_json}


def where_am_i() -> dict[str, Any]:
    from workflows import current_step

    context = current_step()
    assert context is not None
    return {"run": str(context.run_id), "attempt": context.attempt, "step": context.step}


@workflow("test.context")
class Context(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        return step.do("where am I", where_am_i)


def database_session() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    return {"process": os.getpid(), "backend": backend}


@workflow("test.database_session")
class DatabaseSession(Workflow):
    """Which worker process and which PostgreSQL backend ran its one step."""

    def run(self, event: Event, step: Any) -> Any:
        return step.do("database session", database_session)


# --- values PostgreSQL cannot store (engine correctness, issue 6 item 7) -------------------------
def unstorable_value(kind: str) -> Any:
    return "\ud800" if kind == "surrogate" else {"a": ["x\u0000"]}


def unstorable(path: str, kind: str) -> Any:
    append(path, kind)
    return unstorable_value(kind)


@workflow("test.unstorable")
class Unstorable(Workflow):
    """A step returns a lone surrogate or a NUL: as the run's last step (``last``), or in the middle
    with its StepError caught; or the run itself returns one (``as_result``)."""

    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        step.do("before", append, p["path"], "before")
        if p.get("as_result"):
            return unstorable_value(p["kind"])
        if p.get("last"):
            return step.do("unstorable", unstorable, p["path"], p["kind"])
        try:
            step.do("unstorable", unstorable, p["path"], p["kind"])
        except StepError as exc:
            caught = {"type": exc.error_type, "message": exc.message}
        step.do("after", append, p["path"], "after")
        return {"caught": caught}


# --- step timeouts (item 8) ----------------------------------------------------------------------
def first_try(path: str) -> bool:
    append(path, "try")
    return lines(path).count("try") == 1


def swallow_timeout(path: str, hold: float) -> str:
    """On its first try, catch StepTimeout and carry on for ``hold`` seconds."""
    from workflows import StepTimeout

    if not first_try(path):
        return "second try"
    try:
        time.sleep(3600)
    except StepTimeout:
        append(path, "swallowed")
    time.sleep(hold)
    append(path, "woke")
    return "first try"


def blocked_in_c(path: str, hold: float) -> str:
    """On its first try, block in C code with SIGALRM masked, as a C library that blocks signals
    would: the timeout's handler cannot run until it returns."""
    if not first_try(path):
        return "second try"
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        time.sleep(hold)
        append(path, "woke")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})  # the pending alarm fires here
    return "first try"


def query_past_timeout(path: str, marker: str) -> str:
    """On its first try, sit in a PostgreSQL query far longer than the step's timeout."""
    from django.db import connection

    if not first_try(path):
        return "second try"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_sleep(60) /* {marker} */")
    return "first try"


@workflow("test.stuck")
class Stuck(Workflow):
    """One step whose first try outlives its timeout in the way ``how`` says."""

    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        body, arg = {
            "swallow": (swallow_timeout, p.get("hold")),
            "blocked": (blocked_in_c, p.get("hold")),
            "query": (query_past_timeout, p.get("marker")),
        }[p["how"]]
        return step.do(
            "stuck",
            body,
            p["path"],
            arg,
            timeout=p["timeout"],
            retries=Retries(limit=2, delay=timedelta(seconds=0.1), backoff="constant"),
            atomic=p.get("atomic", False),
        )


@workflow("test.steady")
class Steady(Workflow):
    """``steps`` steps of ``seconds`` each, each writing its number to ``path``."""

    def run(self, event: Event, step: Any) -> list[int]:
        p = event.payload
        return [step.do(f"step {i}", write_line, p["path"], i, i, p["seconds"], timeout=2) for i in range(p["steps"])]


# --- a database connection lost inside a step (item 10) -----------------------------------------
def cut_own_connection(path: str, then: str) -> str:
    """On its first try, terminate this worker's own PostgreSQL backend from another session (as a
    failover or a proxy's idle timeout would, unseen by the worker), then raise or return."""
    from django.db import connection, connections

    append(path, then)
    if lines(path).count(then) == 1:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (backend,) = cursor.fetchone()
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [backend])  # waits until it is gone
        finally:
            other.close()
        if then == "raise":
            raise ValueError("the step failed after its connection was lost")
    return then


@workflow("test.cut_connection")
class CutConnection(Workflow):
    """Three steps that each lose the worker's connection on their first try: the first then raises
    (an ordinary retryable error), the second returns, and so does the third, the run's last."""

    def run(self, event: Event, step: Any) -> Any:
        path = event.payload["path"]
        retries = Retries(limit=2, delay=timedelta(seconds=0.2), backoff="constant")
        return [
            step.do(f"{then} after the cut", cut_own_connection, path, then, retries=retries)
            for then in ("raise", "return", "return last")
        ]
