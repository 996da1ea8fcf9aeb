"""The refund tests' world: a real sandbox provider over HTTP and real Celery workers (with beat)
on a queue of this module's own, started with the sandbox's URL and short ledger timeouts.

The workers get their settings from the environment, so they are started here rather than shared
with the session's ``worker`` (which would point at the default provider URL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pytest
from django.conf import settings

from examples.sandbox.process import SandboxProcess
from ledger import HttpAdapter, register_adapter
from tests.factories import Users
from tests.support import Worker


class WorkerEnv(TypedDict):  # its keys, for Worker(**env): none of them is one of Worker's own arguments
    LEDGER_CONNECT_TIMEOUT: str
    LEDGER_READ_TIMEOUT: str
    LEDGER_STALE_SUBMITTED_SECONDS: str
    LEDGER_PROVIDER_GRACE_SECONDS: str
    REFUND_APPROVAL_LIMIT: str


# Read timeout 1 s: a sandbox "timeout" fault makes the outcome unknown quickly. Stale after 4 s
# (> connect 1 + 2 x read 1, ledger.E001): a killed worker's submit is looked up soon. A lookup's
# "not found" is believed 5 s after the last send (connect 1 + 2 x read 1 + grace 2).
LEDGER = {"CONNECT_TIMEOUT": 1.0, "READ_TIMEOUT": 1.0, "STALE_SUBMITTED_SECONDS": 4.0, "PROVIDER_GRACE_SECONDS": 2.0}
WORKER_ENV: WorkerEnv = {
    "LEDGER_CONNECT_TIMEOUT": "1",
    "LEDGER_READ_TIMEOUT": "1",
    "LEDGER_STALE_SUBMITTED_SECONDS": "4",
    "LEDGER_PROVIDER_GRACE_SECONDS": "2",
    "REFUND_APPROVAL_LIMIT": "100.00",
}


class Workers:
    """The module's worker, which a test may kill and replace."""

    def __init__(self, queue: str, url: str) -> None:
        self.queue, self.url = queue, url
        self.current = self.start()

    def start(self) -> Worker:
        return Worker(queue=self.queue, beat=True, SANDBOX_PAYMENTS_URL=self.url, **WORKER_ENV)

    def replace(self) -> Worker:
        self.current.kill()
        self.current = self.start()
        return self.current


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    data: Path = tmp_path_factory.mktemp("sandbox") / "sandbox.sqlite3"
    with SandboxProcess(data) as process:
        yield process


@pytest.fixture(scope="module")
def refund_workers(django_db_setup: None, django_db_blocker: Any, sandbox: SandboxProcess) -> Iterator[Workers]:
    # This process enqueues runs on the module's queue, and reconciles against the sandbox.
    saved = settings.WORKFLOWS, settings.SANDBOX_PAYMENTS_URL, settings.LEDGER
    queue = f"refunds-{uuid.uuid4().hex[:8]}"
    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": queue}
    settings.LEDGER = {**settings.LEDGER, **LEDGER}  # reconcile here judges as the workers do
    settings.SANDBOX_PAYMENTS_URL = sandbox.url
    register_adapter(
        "payments",
        HttpAdapter(
            base_url=sandbox.url,
            submit_path="/v1/{action}s",
            lookup_path="/v1/{action}s?key={key}",
            batch_lookup_path="/v1/{action}s/lookup",
        ),
    )
    workers = Workers(queue, sandbox.url)
    yield workers
    workers.current.stop()
    settings.WORKFLOWS, settings.SANDBOX_PAYMENTS_URL, settings.LEDGER = saved


@dataclass(frozen=True)
class World:
    """What a refund test runs against, beside the ``users``: the sandbox provider and the workers."""

    sandbox: SandboxProcess
    workers: Workers


@pytest.fixture
def world(refund_workers: Workers, sandbox: SandboxProcess, users: Users) -> World:
    """Fresh provider counts, and carol and bob in the refund approvers' group."""
    from django.contrib.auth.models import Group

    sandbox.reset()
    group, _ = Group.objects.get_or_create(name="refund-approvers")
    group.user_set.add(users.carol, users.bob)
    return World(sandbox=sandbox, workers=refund_workers)
