"""The heartbeat thread that extends the leases of the runs a process advances (``workflows.lease``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.factories import make_run
from tests.support import wait_for
from workflows.lease import heartbeat
from workflows.models import RunStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_beat_that_fails_does_not_end_the_heartbeat(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a run whose lease this process holds, and a heartbeat whose next beat fails
    settings.WORKFLOWS = {**settings.WORKFLOWS, "LEASE_SECONDS": 0.6}
    soon = timezone.now() + timedelta(seconds=2)
    run = make_run(status=RunStatus.RUNNING, lease_owner="this-test", lease_expires_at=soon)
    failures = [RuntimeError("settings swapped under the beat")]
    beat = heartbeat._beat

    def failing_once() -> None:
        if failures:
            raise failures.pop()
        beat()

    monkeypatch.setattr(heartbeat, "_beat", failing_once)
    heartbeat.register(run.id, "this-test")
    try:
        # then the beats after it extend the lease all the same
        leases = WorkflowRun.objects.filter(pk=run.pk, lease_expires_at__gt=soon)
        wait_for(
            lambda: not failures and leases.exists(),
            timeout=10,
            what="the lease extended by a beat after the one that failed",
        )
    finally:
        heartbeat.unregister(run.id)
