"""The run command itself, `bash scripts/run.sh`, as a newcomer runs it and then uses what it
serves: a copy of the repository (its own var/), a PostgreSQL database of its own, every process
the script supervises. alice asks the support agent for a refund in chat, a staff member approves
it, the sandbox provider pays it and tells the system so by a signed webhook; alice's onboarding
run goes to the customers' worker. Ctrl-C stops every process the script started.

Nothing else in the suite starts the script: its workers, their queues and the sandbox's webhook
URL are wired there only (a chat turn once waited 45 s behind customers' runs on one worker)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connections

from tests.support import ROOT, database_url, free_port, wait_for

pytestmark = pytest.mark.slow

COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "var", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache"
)


class Served:
    """The script's process and where what it started answers."""

    def __init__(self, app: Path, env: dict[str, str], port: int, sandbox_port: int) -> None:
        self.app, self.env, self.port, self.sandbox_port = app, env, port, sandbox_port
        self.output = (app / "run.out").open("w+")
        self.process = subprocess.Popen(
            ["bash", "scripts/run.sh"],
            cwd=app,
            env=env,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the test's Ctrl-C goes to the script alone, as a terminal's would
            # A terminal's foreground command may be interrupted; a test run started in the background
            # (`scripts/test.sh &`) hands its children SIGINT ignored, which bash then cannot trap.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def log(self, name: str = "") -> str:
        return (self.app / "var" / name).read_text() if name else (self.app / "run.out").read_text()

    def call(self, method: str, path: str, body: Any = None, token: str = "", port: int = 0) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Token {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port or self.port}{path}", data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def healthy(self) -> bool:
        try:
            return self.call("GET", "/healthz")[0] == 200
        except urllib.error.URLError:  # not listening yet
            return False

    def token(self, username: str) -> str:
        out = self.manage("drf_create_token", username)
        match = re.search(r"Generated token (\w+)", out)
        assert match, out
        return match.group(1)

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [".venv/bin/python", "manage.py", *args], cwd=self.app, env=self.env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def deliveries(self) -> list[tuple[str, str]]:
        """What Admin → Webhook deliveries lists of the sandbox's, read from the copy's database."""
        with psycopg.connect(self.env["DATABASE_URL"]) as conn:
            rows = conn.execute(
                "SELECT outcome, reason FROM webhooks_webhookdelivery WHERE source = 'sandbox-payments'"
            )
            return [(outcome, reason) for outcome, reason in rows]

    def processes(self) -> list[int]:
        """Every process working in the copy: what the script started, however deep."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if Path(os.readlink(entry / "cwd")) == self.app:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    app = tmp_path / "app"
    shutil.copytree(ROOT, app, ignore=COPY_IGNORE)  # copy2: pyproject.toml keeps its time, the install holds
    (app / ".venv").symlink_to(ROOT / ".venv")
    settings = connections["default"].settings_dict
    database = f"{settings['NAME']}_run"[:63]
    server = psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or "postgres",
        password=settings["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )
    server.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    server.execute(f'CREATE DATABASE "{database}"')
    tag = f"run-{uuid.uuid4().hex[:8]}"
    # The test process's settings stay out (its fixtures' workflows, short leases, its queues).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WORKFLOWS_", "AGENTS_", "CHANNELS_", "DJANGO_", "PYTEST_", "SANDBOX_"))
    }
    env.update(
        {
            "DATABASE_URL": database_url(settings, database),
            "PORT": str(free_port()),
            "SANDBOX_PORT": str(free_port()),
            "WORKFLOWS_QUEUE": tag,
            "WORKFLOWS_PUBLIC_QUEUE": f"{tag}-public",
            "AGENTS_TURN_QUEUE": f"{tag}-agents",
            "CHANNELS_PREFIX": f"asgi-{tag}",
            "PYTHONPATH": str(app),
        }
    )
    served = Served(app, env, int(env["PORT"]), int(env["SANDBOX_PORT"]))
    try:
        yield served
    finally:
        if served.process.poll() is None:
            served.process.send_signal(signal.SIGINT)
            try:
                served.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for pid in served.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        served.output.close()
        server.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        server.close()


def until(what: str, check: Any, timeout: float = 90.0) -> Any:
    return wait_for(check, timeout=timeout, interval=0.3, what=what)


def test_the_run_command_serves_a_refund_from_chat_to_the_providers_webhook(served: Served) -> None:
    until("the run command to start everything", lambda: "The system is running" in served.log(), timeout=240)
    until("daphne to answer", served.healthy)
    alice, admin = served.token("alice"), served.token("admin")

    # alice asks the support agent in chat; the turn runs on the turn queue's worker
    status, turn = served.call(
        "POST",
        "/api/agents/support/help/messages",
        {"text": "I'd like a refund for order 1042, it arrived damaged"},
        alice,
    )
    assert status == 202, turn

    def ended_turn() -> dict[str, Any] | None:
        found = served.call("GET", f"/api/agents/support/help/turns/{turn['id']}", token=alice)[1]
        return found if found["status"] in ("completed", "failed", "cancelled") else None

    answered = until("the chat turn to end", ended_turn)
    assert answered["status"] == "completed", answered
    assert answered["text"].startswith("I've asked for a refund of £150.00 on order 1042. It is awaiting approval")
    assert " received" in served.log("agents-worker.log")

    # a staff member approves it, at the version they saw
    def refund_approvals() -> list[dict[str, Any]]:
        status, pending = served.call("GET", "/api/approvals?status=pending", token=admin)
        assert status == 200, pending
        return [a for a in pending["results"] if a["subject"]["type"] == "refunds.order"]

    (approval,) = until("the refund's run to ask for approval", refund_approvals)
    status, decided = served.call(
        "POST", f"/api/approvals/{approval['id']}/decision", {"approve": True, "version": approval["version"]}, admin
    )
    assert status == 200, decided

    # the refund's run pays it at the sandbox, whose signed webhook reaches daphne and settles it
    status, runs = served.call("GET", "/api/runs?workflow=refund", token=alice)
    assert status == 200, runs
    (refund_run,) = runs["results"]
    refund_id = served.call("GET", f"/api/runs/{refund_run['id']}", token=alice)[1]["payload"]["request_id"]
    until(
        "the refund to be confirmed",
        lambda: served.call("GET", f"/api/refunds/{refund_id}", token=alice)[1]["status"] == "confirmed",
    )
    status, stats = served.call("GET", "/v1/stats", port=served.sandbox_port)
    assert (status, stats["refunds"]) == (200, 1), stats
    deliveries = until("the provider's webhook to be recorded", served.deliveries)
    assert {outcome for outcome, _ in deliveries} <= {"accepted", "duplicate"}, deliveries
    assert ("accepted", "") in deliveries, deliveries

    # a run alice starts over the API waits on the customers' queue, for the worker of its own
    status, run = served.call(
        "POST", "/api/workflows/demo.onboarding/runs", {"payload": {"work_seconds": 0, "settle_seconds": 0}}, alice
    )
    assert status == 201, run
    until("the customers' worker to take alice's run", lambda: " received" in served.log("public-worker.log"))

    # Ctrl-C: the script stops every process it started
    started = served.processes()
    assert len(started) >= 8, started  # the script, five supervisors, their workers, beat, sandbox, daphne
    served.process.send_signal(signal.SIGINT)
    served.process.wait(timeout=60)
    until("every process the script started to end", lambda: not served.processes(), timeout=30)


@pytest.mark.parametrize("taken", ["PORT", "SANDBOX_PORT"])
def test_a_port_taken_already_is_said_before_anything_starts(tmp_path: Path, taken: str) -> None:
    # another program (another run of the script) listens there: the server started on it would
    # fail to bind and be restarted for ever, and the sandbox's webhooks would go to the other
    app = tmp_path / "app"
    shutil.copytree(ROOT, app, ignore=COPY_IGNORE)
    (app / ".venv").symlink_to(ROOT / ".venv")
    listener = socket.create_server(("127.0.0.1", 0))
    ports = {"PORT": str(free_port()), "SANDBOX_PORT": str(free_port()), taken: str(listener.getsockname()[1])}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_", "SANDBOX_"))}
    try:
        done = subprocess.run(
            ["bash", "scripts/run.sh"], cwd=app, env={**env, **ports}, capture_output=True, text=True, timeout=120
        )
    finally:
        listener.close()

    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {ports[taken]} (" in done.stderr and f"choose another with {taken}=..." in done.stderr
    assert not (app / "var" / "web.log").exists() and "migrat" not in done.stdout.lower()
