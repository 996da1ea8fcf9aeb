"""The runs console: what carol (staff, view + control) and staff without those permissions see and do.

Runs are set up in the database directly; the actions go through the services. These tests run in
one transaction each, so the services' on-commit enqueues are never sent: no worker is involved.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from django.contrib.admin.utils import display_for_value
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.factories import Users, login, make_restarted_wait, make_run
from workflows import services
from workflows.models import RunAttempt, RunEvent, RunStatus, StepKind, StepResult, StepStatus, WorkflowRun

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:workflows_workflowrun_changelist")


def change_url(run: WorkflowRun) -> str:
    return reverse("admin:workflows_workflowrun_change", args=[run.pk])


def waiting_run(event_type: str = "reply", **fields: Any) -> WorkflowRun:
    return make_run(
        workflow="test.wait",
        status=RunStatus.WAITING,
        wait_event_type=event_type,
        wait_step="wait for reply",
        wake_at=timezone.now() + timedelta(minutes=5),
        **fields,
    )


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows", codename__in=codenames))
    return user


def listed(client: Client, query: str = "") -> set[UUID]:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200
    return {run.pk for run in response.context["cl"].result_list}


def act(client: Client, action: str, *runs: WorkflowRun) -> list[str]:
    response = client.post(CHANGELIST, {"action": action, "_selected_action": [str(r.pk) for r in runs]}, follow=True)
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_changelist_shows_runs_with_what_they_wait_for(users: Users) -> None:
    waiting = waiting_run(owner=users.alice)

    response = login(users.carol).get(CHANGELIST)

    assert response.status_code == 200
    html = response.content.decode()
    assert str(waiting.pk) in html
    assert "event “reply” until" in html
    assert "alice" in html


def test_changelist_filters_by_status_workflow_failure_reason_and_waiting_for(users: Users) -> None:
    # given
    reply = waiting_run("reply")
    approve = waiting_run("approve")
    failed = make_run(workflow="test.lines", status=RunStatus.FAILED, failure_reason="max_recovery_attempts")
    queued = make_run(workflow="test.echo", status=RunStatus.QUEUED)
    carol = login(users.carol)

    # then
    assert listed(carol) == {reply.pk, approve.pk, failed.pk, queued.pk}
    assert listed(carol, "?status__exact=waiting") == {reply.pk, approve.pk}
    assert listed(carol, "?workflow=test.lines") == {failed.pk}
    assert listed(carol, "?failure_reason__exact=max_recovery_attempts") == {failed.pk}
    assert listed(carol, "?waiting_for=approve") == {approve.pk}
    assert "event “approve”" in carol.get(CHANGELIST).content.decode()  # offered as a filter choice


def test_search_by_id_workflow_and_idempotency_key(users: Users) -> None:
    keyed = make_run(workflow="test.echo", status=RunStatus.QUEUED, idempotency_key="order-42")
    other = make_run(workflow="test.lines", status=RunStatus.QUEUED)
    carol = login(users.carol)

    assert listed(carol, f"?q={other.pk}") == {other.pk}
    assert listed(carol, "?q=order-42") == {keyed.pk}
    assert listed(carol, "?q=test.lines") == {other.pk}
    assert listed(carol, "?q=nothing-like-this") == set()


def test_change_page_shows_every_attempt_s_steps_and_pretty_error(users: Users) -> None:
    # given: a run on its second attempt; the first failed at its second step
    run = make_run(
        workflow="test.lines",
        status=RunStatus.FAILED,
        attempt=2,
        failure_reason="error",
        error={"type": "ValueError", "message": "boom", "traceback": "Traceback (most recent call last)"},
    )
    RunAttempt.objects.create(run=run, number=1, status=RunStatus.FAILED)
    for attempt, position, name, status in [
        (2, 1, "load order", StepStatus.FAILED),
        (1, 2, "charge card", StepStatus.FAILED),
        (1, 1, "load order", StepStatus.COMPLETED),
    ]:
        StepResult.objects.create(
            run=run,
            attempt=attempt,
            position=position,
            name=name,
            kind=StepKind.DO,
            status=status,
            result={"order": 7} if status == StepStatus.COMPLETED else None,
        )
    RunEvent.objects.create(run=run, type="customer.reply", payload={"text": "hi"})

    # when
    response = login(users.carol).get(change_url(run))

    # then
    assert response.status_code == 200
    html = response.content.decode()
    steps = [form.instance for form in response.context["inline_admin_formsets"][0].formset.forms]
    assert [(s.attempt, s.position, s.name) for s in steps] == [
        (1, 1, "load order"),
        (1, 2, "charge card"),
        (2, 1, "load order"),
    ]
    assert "step timeline (every attempt)" in html.lower()
    assert "&quot;message&quot;: &quot;boom&quot;" in html  # indented JSON, escaped
    assert "Traceback (most recent call last)" in html
    assert "customer.reply" in html
    assert 'name="_save"' not in html  # view-only: the engine owns every field


def test_a_steps_timer_shows_only_while_it_can_fire(users: Users) -> None:
    # a run waiting on attempt 2, its attempt 1 restarted away from while it waited too
    wake = timezone.now() + timedelta(hours=1)
    run = make_restarted_wait(wake_at=wake)

    def timers() -> list[Any]:
        response = login(users.carol).get(change_url(run))
        inline = response.context["inline_admin_formsets"][0]
        with CaptureQueriesContext(connection) as read:
            shown = [inline.opts.timer(form.instance) for form in inline.formset.forms]
        assert not read.captured_queries  # each step came with its run
        return shown

    shown = display_for_value(wake, "-")  # as the admin shows a date
    assert timers() == ["-", shown]  # the current attempt's only
    WorkflowRun.objects.filter(pk=run.pk).update(status=RunStatus.TERMINATED)
    assert timers() == ["-", "-"]  # nothing fires once the run ended


def test_pause_action_pauses_through_the_service(users: Users) -> None:
    run = waiting_run()

    messages = act(login(users.carol), "pause_runs", run)

    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED
    assert messages == [f"Run test.wait {run.pk}: paused (now paused, attempt 1)"]


def test_pause_of_a_running_run_is_a_request(users: Users) -> None:
    run = make_run(workflow="test.lines", status=RunStatus.RUNNING)

    messages = act(login(users.carol), "pause_runs", run)

    run.refresh_from_db()
    assert (run.status, run.pause_requested) == (RunStatus.RUNNING, True)
    assert "pauses at its next step boundary" in messages[0]


def test_restart_and_terminate_actions(users: Users) -> None:
    failed = make_run(workflow="test.lines", status=RunStatus.FAILED, failure_reason="error")
    waiting = waiting_run()
    carol = login(users.carol)

    # restart asks first, showing the attempt it will replace, and changes nothing yet
    asked = carol.post(CHANGELIST, {"action": "restart_runs", "_selected_action": [str(failed.pk)]})
    assert asked.status_code == 200 and f'name="attempt-{failed.pk}" value="1"' in asked.content.decode()
    assert "&rsaquo; Restart runs" in asked.content.decode()
    assert '<input type="hidden" name="action" value="restart_runs">' in asked.content.decode()
    assert '<input type="submit" class="default" value="Restart">' in asked.content.decode()
    assert WorkflowRun.objects.get(pk=failed.pk).attempt == 1
    confirmed = {
        "action": "restart_runs",
        "_selected_action": [str(failed.pk)],
        f"attempt-{failed.pk}": "1",
        "apply": "1",
    }
    restarted = carol.post(CHANGELIST, confirmed, follow=True)
    act(carol, "terminate_runs", waiting)

    failed.refresh_from_db()
    waiting.refresh_from_db()
    assert [str(m) for m in get_messages(restarted.wsgi_request)] == [
        f"Run test.lines {failed.pk}: restarted (now queued, attempt 2)"
    ]
    assert (failed.status, failed.attempt, failed.failure_reason) == (RunStatus.QUEUED, 2, "")
    assert list(failed.attempts.values_list("number", flat=True)) == [1, 2]
    assert waiting.status == RunStatus.TERMINATED

    # the confirmation sent again (a double click, a second tab) leaves the new attempt to run
    again = carol.post(CHANGELIST, confirmed, follow=True)
    assert [str(m) for m in get_messages(again.wsgi_request)] == [
        f"Run test.lines {failed.pk}: not restarted: it is on attempt 2 now, not attempt 1 (restarted already?)"
    ]
    assert list(failed.attempts.values_list("number", flat=True)) == [1, 2]


def test_a_restart_confirmation_without_a_clean_attempt_restarts_nothing(users: Users) -> None:
    run = make_run(workflow="test.lines", status=RunStatus.FAILED, failure_reason="error")
    carol = login(users.carol)
    for seen in (None, "", "abc", "-1", "1.0", " 1", "+1", "\u00b9", "1" * 5000):
        confirmed = {"action": "restart_runs", "_selected_action": [str(run.pk)], "apply": "1"}
        if seen is not None:
            confirmed[f"attempt-{run.pk}"] = seen
        answered = carol.post(CHANGELIST, confirmed, follow=True)
        assert answered.status_code == 200, seen
        assert [str(m) for m in get_messages(answered.wsgi_request)] == [
            f"Run test.lines {run.pk}: not restarted: "
            "the confirmation did not say which attempt you saw; select it again"
        ], seen
        assert WorkflowRun.objects.get(pk=run.pk).attempt == 1, seen


def test_a_restart_confirmed_from_a_filtered_list_tells_of_a_run_that_left_the_filter(users: Users) -> None:
    run = make_run(workflow="test.lines", status=RunStatus.FAILED, failure_reason="error")
    carol = login(users.carol)
    asked = carol.post(
        f"{CHANGELIST}?status__exact=failed", {"action": "restart_runs", "_selected_action": [str(run.pk)]}
    )
    assert f'<form method="post" action="{CHANGELIST}">' in asked.content.decode()
    # (someone else restarts it meanwhile: it is queued now, out of the "failed" filter)
    services.run_restart(run_id=run.pk, attempt=1)

    confirmed = {"action": "restart_runs", "_selected_action": [str(run.pk)], f"attempt-{run.pk}": "1", "apply": "1"}
    answered = carol.post(CHANGELIST, confirmed, follow=True)
    assert [str(m) for m in get_messages(answered.wsgi_request)] == [
        f"Run test.lines {run.pk}: not restarted: it is on attempt 2 now, not attempt 1 (restarted already?)"
    ]


def test_refused_action_reports_the_reason_and_changes_nothing(users: Users) -> None:
    # given: one run resume applies to, one it does not
    queued = make_run(workflow="test.echo", status=RunStatus.QUEUED)
    paused = make_run(workflow="test.echo", status=RunStatus.PAUSED)
    before = WorkflowRun.objects.get(pk=queued.pk)

    # when
    messages = act(login(users.carol), "resume_runs", queued, paused)

    # then: the refusal is reported per run, the other run still resumed
    assert f"Run test.echo {queued.pk}: cannot resume a run that is queued" in messages
    assert f"Run test.echo {paused.pk}: resumed (now queued, attempt 1)" in messages
    queued.refresh_from_db()
    assert (queued.status, queued.updated_at, queued.enqueued_at) == (
        before.status,
        before.updated_at,
        before.enqueued_at,
    )


def test_terminate_of_a_finished_run_is_refused(users: Users) -> None:
    done = make_run(workflow="test.echo", status=RunStatus.COMPLETED, result={"ok": True})

    messages = act(login(users.carol), "terminate_runs", done)

    done.refresh_from_db()
    assert done.status == RunStatus.COMPLETED
    assert messages == [f"Run test.echo {done.pk}: cannot terminate a run that is completed"]


def test_staff_without_control_permission_cannot_act(users: Users) -> None:
    # given: dave may look at runs, and change them, but not control them
    users.dave.user_permissions.add(Permission.objects.get(codename="change_workflowrun"))
    dave = login(users.dave)
    run = waiting_run()

    # when
    assert listed(dave) == {run.pk}
    action_form = dave.get(CHANGELIST).context["action_form"]
    messages = act(dave, "pause_runs", run)

    # then: no action offered (the controls are the only actions), the posted one ignored, the run untouched
    assert action_form is None
    assert messages == []
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_staff_without_view_permission_see_nothing(users: Users) -> None:
    eve = login(staff("eve"))
    run = waiting_run()

    assert eve.get(CHANGELIST).status_code == 403
    assert eve.get(change_url(run)).status_code == 403
    assert eve.post(CHANGELIST, {"action": "pause_runs", "_selected_action": [str(run.pk)]}).status_code == 403
    assert "workflowrun" not in eve.get(reverse("admin:index")).content.decode().lower()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_no_add_and_no_delete(users: Users) -> None:
    run = make_run(status=RunStatus.QUEUED)
    carol = login(users.carol)

    assert carol.get(reverse("admin:workflows_workflowrun_add")).status_code == 403
    assert carol.post(reverse("admin:workflows_workflowrun_delete", args=[run.pk]), {"post": "yes"}).status_code == 403
    assert carol.post(change_url(run), {"workflow": "changed"}).status_code == 403
    assert WorkflowRun.objects.get(pk=run.pk).workflow == "test.echo"
