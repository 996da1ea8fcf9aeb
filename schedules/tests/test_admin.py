"""The admin: schedules listed with what, when, next due and last fired; added and edited through
the checks; enabled, disabled and fired now by staff who may change them; firings read-only."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from schedules.admin import STALE
from schedules.models import Outcome, Schedule, ScheduleFiring, Trigger
from schedules.services import schedules_tick
from schedules.tests.support import workflow_schedule
from tests.factories import Users, login

pytestmark = pytest.mark.django_db
URL = "/admin/schedules/schedule/"
FIRINGS = "/admin/schedules/schedulefiring/"


def staff(user: User, *codenames: str) -> User:
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def carol(users: Users) -> User:
    """A superuser: schedules reach every workflow and every account, so only superusers change them."""
    user = staff(users.carol)
    user.is_superuser = True
    user.save()
    return user


@pytest.fixture
def dave(users: Users) -> User:
    """The auditor: may view, not change."""
    return staff(users.dave, "view_schedule", "view_schedulefiring")


def test_the_list_and_a_schedule_page_show_when_what_and_the_latest_firings(carol: User) -> None:
    schedule = workflow_schedule(due=timezone.now() - timedelta(seconds=1), every=3600)
    schedules_tick()
    client = login(carol)

    listed = client.get(URL).content.decode()
    page = client.get(f"{URL}{schedule.pk}/change/").content.decode()
    firings = client.get(FIRINGS, {"schedule__id__exact": schedule.pk}).content.decode()

    assert "echo" in listed and "every 1h" in listed and "start test.echo" in listed
    firing = ScheduleFiring.objects.get(schedule=schedule)
    assert 'class="schedule-firings"' in page and str(firing.run_id) in page
    assert firing.idempotency_key not in firings and str(firing.run_id) in firings  # the run's link


def test_the_list_says_how_each_schedules_latest_firing_went(carol: User) -> None:
    ok = workflow_schedule("ok", due=timezone.now() - timedelta(seconds=1), every=3600)
    # ledger.reconcile refuses a payload key it does not know (the row skipped the admin's checks)
    broken = workflow_schedule(
        "broken", due=timezone.now() - timedelta(seconds=1), every=3600, workflow="ledger.reconcile", payload={"x": 1}
    )
    workflow_schedule("never", due=None, every=3600)  # armed by the tick, never fired
    schedules_tick()
    assert {f.schedule_id: f.outcome for f in ScheduleFiring.objects.all()} == {
        ok.pk: Outcome.STARTED,
        broken.pk: Outcome.FAILED,
    }

    listed = login(carol).get(URL).content.decode()

    assert "Latest outcome" in listed
    rows = {name: listed[listed.index(f">{name}<") :][:2000] for name in ("ok", "broken", "never")}
    assert ">started<" in rows["ok"].split("</tr>")[0]
    assert "failed</strong>" in rows["broken"].split("</tr>")[0]
    assert ">-<" in rows["never"].split("</tr>")[0]


def test_add_checks_the_schedule_and_works_out_its_next_due_time(carol: User) -> None:
    form = {"name": "hourly", "cron": "0 * * * *", "timezone": "UTC", "action": "workflow", "workflow": "test.echo"}
    client = login(carol)

    refused = client.post(f"{URL}add/", {**form, "cron": "0 25 * * *", "payload": "{}", "enabled": "on"})
    added = client.post(f"{URL}add/", {**form, "payload": "{}", "enabled": "on"})

    assert refused.status_code == 200 and "hour: 25 is out of range 0-23" in refused.content.decode()
    assert added.status_code == 302
    schedule = Schedule.objects.get(name="hourly")
    assert schedule.next_due_at is not None and schedule.next_due_at.minute == 0
    assert schedule.next_due_at - timezone.now() <= timedelta(hours=1)


def test_a_payload_nested_past_what_the_parser_reads_is_a_field_error_not_a_500(carol: User) -> None:
    form = {"name": "deep", "cron": "0 * * * *", "timezone": "UTC", "action": "workflow", "workflow": "test.echo"}

    refused = login(carol).post(f"{URL}add/", {**form, "payload": "[" * 2000 + "]" * 2000, "enabled": "on"})

    assert refused.status_code == 200
    assert "Nested more than 100 levels deep." in refused.content.decode()
    assert not Schedule.objects.filter(name="deep").exists()


def test_actions_enable_disable_and_fire_now(carol: User) -> None:
    schedule = workflow_schedule(due=None, enabled=False)
    client = login(carol)

    def act(action: str) -> str:
        response = client.post(URL, {"action": action, "_selected_action": [schedule.pk]}, follow=True)
        return response.content.decode()

    assert "1 schedule(s) enabled." in act("enable")
    schedule.refresh_from_db()
    assert schedule.enabled and schedule.next_due_at is not None
    assert "Schedule echo: started." in act("fire_now")
    assert ScheduleFiring.objects.get(schedule=schedule).trigger == Trigger.MANUAL
    assert "1 schedule(s) disabled." in act("disable")
    schedule.refresh_from_db()
    assert not schedule.enabled


def test_an_auditor_sees_and_changes_nothing_and_firings_are_read_only(dave: User) -> None:
    schedule = workflow_schedule(due=None, enabled=False)
    client = login(dave)

    assert client.get(URL).status_code == 200
    response = client.post(URL, {"action": "fire_now", "_selected_action": [schedule.pk]})
    assert response.status_code == 200 and not ScheduleFiring.objects.exists()  # no such action for him
    assert client.post(f"{URL}{schedule.pk}/change/", {"name": "renamed"}).status_code == 403
    firing = ScheduleFiring.objects.create(
        schedule=schedule, due_at=timezone.now(), outcome=Outcome.FAILED, idempotency_key="k", error="boom"
    )
    assert "boom" in client.get(f"{FIRINGS}{firing.pk}/change/").content.decode()
    assert client.get(f"{FIRINGS}add/").status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).name == "echo"


def test_staff_with_the_schedule_permissions_but_not_superuser_change_nothing(users: Users) -> None:
    # a schedule may start a private workflow with any payload, or post into any account's chat
    bob = staff(users.bob, "view_schedule", "change_schedule", "add_schedule", "delete_schedule")
    schedule = workflow_schedule(due=None, enabled=False)
    client = login(bob)

    assert client.get(URL).status_code == 200
    assert client.get(f"{URL}add/").status_code == 403
    assert client.post(f"{URL}{schedule.pk}/change/", {"name": "renamed"}).status_code == 403
    assert client.post(f"{URL}{schedule.pk}/delete/", {"post": "yes"}).status_code == 403
    client.post(URL, {"action": "fire_now", "_selected_action": [schedule.pk]})
    assert not ScheduleFiring.objects.exists()
    assert Schedule.objects.get(pk=schedule.pk).name == "echo"


def edit_page(client: Any, schedule: Schedule) -> dict[str, str]:
    """The change page's form as loaded, its hidden ``seen`` included."""
    page = client.get(f"{URL}{schedule.pk}/change/").content.decode()
    seen = re.search(r'name="seen" value="([^"]*)"', page)
    assert seen, "the page carries the settings it shows"
    return {
        "name": schedule.name,
        "description": schedule.description,
        "interval_seconds": str(schedule.interval_seconds or ""),
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "initial-timezone": schedule.timezone,  # a callable default's hidden initial, as a browser sends it
        "action": schedule.action,
        "workflow": schedule.workflow,
        "payload": json.dumps(schedule.payload),
        **({"enabled": "on"} if schedule.enabled else {}),
        "seen": html.unescape(seen.group(1)),
    }


def test_a_page_opened_before_the_schedule_was_disabled_cannot_enable_it_again(carol: User) -> None:
    schedule = workflow_schedule(due=timezone.now() + timedelta(minutes=1))
    client = login(carol)
    # given the page open, and another operator disabling the schedule meanwhile
    form = edit_page(client, schedule)
    client.post(URL, {"action": "disable", "_selected_action": [schedule.pk]})

    # when the page is saved with only its description changed
    refused = client.post(f"{URL}{schedule.pk}/change/", {**form, "description": "nightly, see runbook"})

    # then the save is refused and the schedule stays disabled, as the other operator left it
    assert refused.status_code == 200
    # (above the form, where the admin shows it: not on the hidden field, hidden with it)
    assert refused.context["adminform"].form.non_field_errors() == [STALE]
    assert f'<ul class="errorlist nonfield"><li>{html.escape(STALE)}</li></ul>' in refused.content.decode()
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.description, schedule.next_due_at) == (False, "", None)
    # and the page reloaded saves the change, leaving it disabled
    saved = client.post(f"{URL}{schedule.pk}/change/", {**edit_page(client, schedule), "description": "runbook"})
    assert saved.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.description) == (False, "runbook")


@pytest.mark.parametrize("seen", ["", "not json", "[1]", "[" * 100_000], ids=["none", "text", "a list", "deep"])
def test_a_save_without_the_settings_its_page_loaded_is_refused(carol: User, seen: str) -> None:
    schedule = workflow_schedule(due=timezone.now() + timedelta(minutes=1))
    client = login(carol)

    refused = client.post(f"{URL}{schedule.pk}/change/", {**edit_page(client, schedule), "seen": seen, "enabled": ""})

    assert refused.status_code == 200
    assert refused.context["adminform"].form.non_field_errors() == [STALE]
    assert Schedule.objects.get(pk=schedule.pk).enabled


def test_a_page_opened_before_a_firing_still_saves_and_keeps_the_ticks_times(carol: User) -> None:
    schedule = workflow_schedule(due=timezone.now() - timedelta(seconds=1), every=3600)
    client = login(carol)
    # given the page open, and the tick firing the schedule meanwhile (its times change, not its settings)
    form = edit_page(client, schedule)
    schedules_tick()
    schedule.refresh_from_db()
    ticked = (schedule.next_due_at, schedule.last_fired_at)

    saved = client.post(f"{URL}{schedule.pk}/change/", {**form, "description": "hourly echo"})

    assert saved.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.description, (schedule.next_due_at, schedule.last_fired_at)) == ("hourly echo", ticked)
