"""What tests set up by hand: the cast of users, a run in any state, a client signed in as someone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.backends.base import SessionBase
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from workflows.models import TERMINAL, RunAttempt, RunStatus, StepKind, StepResult, StepStatus, WorkflowRun


@dataclass(frozen=True)
class Users:
    """The suite's cast, each with one role everywhere (the ``users`` fixture says which)."""

    alice: User
    bob: User
    carol: User
    dave: User
    erin: User
    mallory: User


def create_users() -> Users:
    """The cast, as the ``users`` fixture documents it: who is staff, and the permissions every app
    gives them. An app's own groups (its approvers) are its tests' to add."""
    alice, bob, carol, dave, erin, mallory = (
        User.objects.create_user(name, f"{name}@example.com", "pw-" + name)
        for name in ("alice", "bob", "carol", "dave", "erin", "mallory")
    )
    for staff, codenames in (
        (carol, ["view_workflowrun", "change_workflowrun", "control_workflowrun"]),
        (dave, ["view_workflowrun", "view_approvalrequest"]),
        (erin, ["decide_any"]),
    ):
        staff.is_staff = True
        staff.save()
        staff.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return Users(alice=alice, bob=bob, carol=carol, dave=dave, erin=erin, mallory=mallory)


def make_run(
    *, workflow: str = "test.echo", status: str = RunStatus.COMPLETED, owner: User | None = None, **fields: Any
) -> WorkflowRun:
    """A run written straight to the database in any state, with its current attempt. Completed by
    default, so no worker or sweeper ever touches it; an ended run's attempt ended with it (the
    engine records an attempt's status when it ends)."""
    # The status is a protected FSM field: set once at creation, as a fixture of any state.
    run = WorkflowRun.objects.create(workflow=workflow, status=status, owner=owner, **fields)
    RunAttempt.objects.create(run=run, number=run.attempt, status=status if status in TERMINAL else RunStatus.QUEUED)
    return run


def make_restarted_wait(*, wake_at: datetime) -> WorkflowRun:
    """A ``test.wait`` run waiting on attempt 2 for a reply, restarted while attempt 1 waited too:
    each attempt has a waiting step "nap" whose timer is ``wake_at``."""
    run = make_run(
        workflow="test.wait",
        status=RunStatus.WAITING,
        attempt=2,
        wait_step="nap",
        wait_event_type="reply",
        wake_at=wake_at,
    )
    for attempt in (1, 2):
        StepResult.objects.create(
            run=run,
            attempt=attempt,
            position=1,
            name="nap",
            kind=StepKind.WAIT,
            status=StepStatus.WAITING,
            wake_at=wake_at,
        )
    return run


def login(user: User, *, enforce_csrf_checks: bool = False) -> Client:
    """A test client signed in as ``user`` (a session, as after the login page)."""
    client = Client(enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(user)
    return client


def session_of(client: Client) -> SessionBase:
    """The session ``client`` is signed in with, as a socket's scope holds it (``scope["session"]``)."""
    store: SessionBase = import_module(settings.SESSION_ENGINE).SessionStore(session_key=client.session.session_key)
    return store


def api_login(
    user: User | None, *, via: Literal["token", "force", "session"] = "token", enforce_csrf_checks: bool = False
) -> APIClient:
    """An API client signed in as ``user``, or anonymous for None. ``via`` says how, as the test means it:
    ``token``, the way other systems call the API (through the real authentication); ``force``, DRF's
    ``force_authenticate``, which skips authentication and writes nothing (no token row: safe from
    threads racing on one user, and in tests that count what a request writes); ``session``, as after
    the login page, where request.user is Django's lazy user and writes need CSRF once
    ``enforce_csrf_checks`` is on."""
    client = APIClient(enforce_csrf_checks=enforce_csrf_checks)
    if user is None:
        return client
    if via == "token":
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    elif via == "force":
        client.force_authenticate(user)
    else:
        client.force_login(user)
    return client
