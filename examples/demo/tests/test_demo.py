"""The demo end to end on a real worker, and its seeding command."""
from __future__ import annotations

from io import StringIO
from typing import Any, cast

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import call_command

from examples.demo.management.commands.seed_demo import RUN_KEY
from tests.support import Worker, wait_for_status, wait_for_terminal
from workflows import public as wf
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun

# Short enough for a test, long enough that the sleep really suspends the run.
FAST = {"customer": "bob", "plan": "team", "work_seconds": 0.5, "settle_seconds": 1}
STEPS = ["create account", "provision workspace", "import sample data", "let the workspace settle",
         "wait for approval", "send welcome"]


def steps_of(run_id: Any) -> list[tuple[str, str]]:
    return list(StepResult.objects.filter(run_id=run_id).order_by("position").values_list("name", "status"))


@pytest.mark.django_db(transaction=True)
def test_onboarding_completes_after_approval(worker: Worker) -> None:
    # given: the run works through its steps and its durable sleep, then waits for approval
    run = wf.start("demo.onboarding", {**FAST, "approval_timeout_seconds": 300})
    waiting = cast(WorkflowRun, wait_for_status(run.id, RunStatus.WAITING, timeout=90))
    assert waiting.wait_event_type == "approve"
    assert waiting.progress == {"done": 4, "total": 6, "stage": "settled; awaiting approval"}

    # when
    wf.send_event(run.id, "approve", {"by": "carol"})

    # then
    done = cast(WorkflowRun, wait_for_terminal(run.id, timeout=60))
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.result is not None
    assert done.result["approved_by"] == "carol"
    assert done.result["welcome"] == {"to": "bob", "template": "welcome"}
    assert done.progress == {"done": 6, "total": 6, "stage": "done"}
    assert steps_of(run.id) == [(name, StepStatus.COMPLETED) for name in STEPS]


@pytest.mark.django_db(transaction=True)
def test_onboarding_carries_on_unapproved_when_the_wait_times_out(worker: Worker) -> None:
    run = wf.start("demo.onboarding", {**FAST, "approval_timeout_seconds": 1})

    done = cast(WorkflowRun, wait_for_terminal(run.id, timeout=90))

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.result is not None
    assert done.result["approved"] is False
    assert done.result["welcome"]["template"] == "welcome-pending-review"
    assert ("wait for approval", StepStatus.FAILED) in steps_of(run.id)  # the WaitTimeout, recorded


@pytest.mark.django_db
def test_seed_demo_is_idempotent() -> None:
    # when: seeded twice
    first, second = StringIO(), StringIO()
    call_command("seed_demo", stdout=first)
    call_command("seed_demo", stdout=second)

    # then: one of each, logins that work, one run owned by alice
    admin, alice = User.objects.get(username="admin"), User.objects.get(username="alice")
    assert (admin.is_superuser, admin.is_staff, alice.is_staff) == (True, True, False)
    assert authenticate(username="admin", password="admin") == admin
    assert authenticate(username="alice", password="alice") == alice
    run = WorkflowRun.objects.get()
    assert (run.workflow, run.owner, run.idempotency_key) == ("demo.onboarding", alice, RUN_KEY)
    assert "admin  / admin" in first.getvalue() and "alice  / alice" in first.getvalue()
    assert f"Demo run {run.pk} (demo.onboarding, owner alice): started." in first.getvalue()
    assert "already existed" in second.getvalue()
    assert f"Demo run {run.pk} (demo.onboarding, owner alice): already exists" in second.getvalue()


@pytest.mark.django_db
def test_seed_demo_leaves_a_changed_password_alone() -> None:
    call_command("seed_demo", stdout=StringIO())
    alice = User.objects.get(username="alice")
    alice.set_password("a better one")
    alice.save()

    call_command("seed_demo", stdout=StringIO())

    assert authenticate(username="alice", password="a better one") == alice
