"""The tick fires each due time once and moves the schedule on; a missed night fires once; a
refused or broken firing is recorded and the schedule goes on; "fire now", enable, disable and
edits keep the due time right. In one test transaction each (the race is test_concurrency.py)."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from unittest.mock import ANY

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError

from accounts.services import account_ensure
from agents.models import Agent, Submission, Turn
from schedules.models import Outcome, Schedule, ScheduleFiring, Trigger
from schedules.services import (
    ScheduleChanged,
    firing_purge,
    schedule_fire,
    schedule_save,
    schedule_settings,
    schedules_enable,
    schedules_tick,
)
from schedules.tests.support import submission_schedule, workflow_schedule
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db
NOW = datetime(2025, 1, 6, 10, 20, 30, tzinfo=UTC)


def firings(schedule: Schedule) -> list[ScheduleFiring]:
    return list(ScheduleFiring.objects.filter(schedule=schedule).order_by("due_at"))


def test_a_tick_fires_a_due_schedule_once_and_moves_it_on() -> None:
    # given
    due = NOW - timedelta(seconds=1)
    schedule = workflow_schedule(due=due)

    # when
    report = schedules_tick(now=NOW)
    again = schedules_tick(now=NOW)  # a beat restarted, or a second beat, at the same moment

    # then
    [firing] = firings(schedule)
    assert [f.pk for f in report.fired] == [firing.pk] and again.fired == []
    assert (firing.due_at, firing.outcome, firing.trigger) == (due, Outcome.STARTED, Trigger.SCHEDULE)
    run = firing.run
    assert run is not None
    assert run.idempotency_key == f"schedule:echo:{due.isoformat()}" == firing.idempotency_key
    assert (run.workflow, run.payload, run.owner_id) == ("test.echo", {"from": "echo"}, None)
    schedule.refresh_from_db()
    assert (schedule.next_due_at, schedule.last_fired_at) == (due + timedelta(seconds=60), NOW)

    schedules_tick(now=NOW + timedelta(seconds=59))
    assert len(firings(schedule)) == 2
    assert WorkflowRun.objects.filter(idempotency_key__startswith="schedule:echo:").count() == 2


def test_after_a_downtime_only_the_latest_missed_due_time_fires() -> None:
    schedule = workflow_schedule(due=datetime(2025, 1, 6, 7, tzinfo=UTC), every=None, cron="0 * * * *")

    schedules_tick(now=NOW)

    assert [f.due_at for f in firings(schedule)] == [datetime(2025, 1, 6, 10, tzinfo=UTC)]
    schedule.refresh_from_db()
    assert schedule.next_due_at == datetime(2025, 1, 6, 11, tzinfo=UTC)


def test_missed_due_times_are_said_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    schedule = workflow_schedule(due=datetime(2025, 1, 6, 7, tzinfo=UTC), every=None, cron="0 * * * *")

    with caplog.at_level("WARNING", logger="schedules"):
        schedules_tick(now=NOW)

    [record] = [r for r in caplog.records if getattr(r, "event", "") == "schedule.missed"]
    assert "from 2025-01-06T07:00:00+00:00 to before 2025-01-06T10:00:00+00:00 were missed" in record.getMessage()
    assert len(firings(schedule)) == 1


def test_a_due_time_years_before_the_next_fires_and_the_schedule_goes_on() -> None:
    # given February 29 on a Sunday, due in 2032 (the next is in 2060)
    due = datetime(2032, 2, 29, tzinfo=UTC)
    schedule = workflow_schedule(due=due, every=None, cron="0 0 29 2 */7,0")

    # when the tick runs at that time
    report = schedules_tick(now=due + timedelta(seconds=3))

    # then it fires for it, and is due next in 2060, still enabled
    assert [f.due_at for f in report.fired] == [due] and report.disabled == []
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_due_at) == (True, datetime(2060, 2, 29, tzinfo=UTC))


def test_not_due_disabled_and_unarmed_schedules_do_not_fire() -> None:
    Schedule.objects.all().delete()  # the nightly reconcile the migration installed
    later = workflow_schedule("later", due=NOW + timedelta(seconds=1))
    off = workflow_schedule("off", due=NOW - timedelta(hours=1), enabled=False)
    installed = workflow_schedule("installed", due=None, every=None, cron="30 2 * * *")  # as a migration leaves it

    report = schedules_tick(now=NOW)

    assert report.fired == [] and report.armed == 1
    assert ScheduleFiring.objects.filter(schedule__in=[later, off, installed]).count() == 0
    installed.refresh_from_db()
    assert installed.next_due_at == datetime(2025, 1, 7, 2, 30, tzinfo=UTC)


def test_a_refused_firing_is_recorded_and_the_schedule_and_the_others_go_on() -> None:
    # ledger.reconcile refuses a payload key it does not know; the row skipped the admin's checks.
    broken = workflow_schedule("broken", due=NOW, workflow="ledger.reconcile", payload={"bogus": 1})
    fine = workflow_schedule("fine", due=NOW)

    schedules_tick(now=NOW)

    [failed] = firings(broken)
    assert failed.outcome == Outcome.FAILED and failed.run_id is None
    assert failed.error.startswith("InvalidPayload: unknown keys: bogus")
    assert not WorkflowRun.objects.filter(workflow="ledger.reconcile").exists()
    broken.refresh_from_db()
    assert broken.next_due_at == NOW + timedelta(seconds=60)  # not tried again at every tick
    assert firings(fine)[0].outcome == Outcome.STARTED


def test_a_schedule_of_an_internal_workflow_saved_past_the_checks_fails_each_firing() -> None:
    # written before agents.turn was internal, or by code: the firing refuses it all the same
    turn = {"turn": "00000000-0000-0000-0000-000000000000"}
    legacy = workflow_schedule("legacy-turn", due=NOW, workflow="agents.turn", payload=turn)

    schedules_tick(now=NOW)

    [failed] = firings(legacy)
    assert failed.outcome == Outcome.FAILED and failed.run_id is None
    assert failed.error.startswith("ActionFailed: workflow 'agents.turn' is started only by its own app")
    assert not WorkflowRun.objects.filter(workflow="agents.turn").exists()


def test_a_submission_schedule_submits_once_per_due_time_to_the_agent_it_names() -> None:
    account = account_ensure(slug="acme")
    due = datetime(2025, 1, 6, 10, tzinfo=UTC)
    schedule = submission_schedule(due=due)

    schedules_tick(now=NOW)
    schedules_tick(now=NOW)

    [firing] = firings(schedule)
    submission = Submission.objects.get()
    assert firing.submission_id == submission.pk and firing.outcome == Outcome.STARTED
    assert submission.agent == Agent.objects.get(account=account, kind="test.chat", name="reminders")
    assert submission.messages == [{"role": "user", "content": "Time to re-assess the suppliers."}]
    assert submission.metadata == {"schedule": "remind", "due_at": due.isoformat()}
    assert submission.idempotency_key == f"schedule:remind:{due.isoformat()}" and submission.submitted_by is None
    assert Turn.objects.filter(agent=submission.agent).count() == 1


def test_a_submission_to_an_account_that_does_not_exist_fails_and_creates_nothing() -> None:
    schedule = submission_schedule(due=NOW, account="nobody")

    schedules_tick(now=NOW)

    [firing] = firings(schedule)
    assert (firing.outcome, firing.error) == (Outcome.FAILED, "ActionFailed: no account 'nobody'")
    assert not Agent.objects.exists() and not Submission.objects.exists()


def test_fire_now_is_a_firing_due_now_whatever_the_schedule_and_once_per_instant() -> None:
    due = NOW + timedelta(hours=1)
    schedule = workflow_schedule(due=due, enabled=False)

    firing = schedule_fire(schedule=schedule, now=NOW)
    same_instant = schedule_fire(schedule=schedule, now=NOW + timedelta(milliseconds=300))  # a double click

    assert firing is not None and (firing.due_at, firing.trigger) == (NOW, Trigger.MANUAL)
    assert firing.run_id is not None and same_instant is None
    assert len(firings(schedule)) == 1
    schedule.refresh_from_db()
    assert (schedule.next_due_at, schedule.last_fired_at, schedule.enabled) == (due, NOW, False)


def test_enabling_counts_from_now_so_what_was_missed_while_disabled_never_fires() -> None:
    schedule = workflow_schedule(due=NOW - timedelta(days=3), enabled=False)

    assert schedules_enable(schedules=[schedule], enabled=True, now=NOW) == 1
    assert schedules_enable(schedules=[schedule], enabled=True, now=NOW) == 0
    schedules_tick(now=NOW)

    schedule.refresh_from_db()
    assert schedule.enabled and schedule.next_due_at == NOW + timedelta(seconds=60)
    assert firings(schedule) == []
    schedules_enable(schedules=[schedule], enabled=False, now=NOW)
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.next_due_at is None


def test_an_edit_leaves_the_ticks_due_time_unless_the_timing_changed() -> None:
    schedule = workflow_schedule(due=NOW - timedelta(seconds=1))
    stale = Schedule.objects.get(pk=schedule.pk)  # a form loaded before the tick
    schedules_tick(now=NOW)

    stale.description = "edited"
    schedule_save(schedule=stale, changed=["description"], now=NOW)
    schedule.refresh_from_db()
    assert schedule.description == "edited"
    assert (schedule.next_due_at, schedule.last_fired_at) == (NOW + timedelta(seconds=59), NOW)

    stale.interval_seconds = 3600
    schedule_save(schedule=stale, changed=["interval_seconds"], now=NOW)
    schedule.refresh_from_db()
    assert schedule.next_due_at == NOW + timedelta(hours=1)


def test_an_edit_of_settings_changed_since_it_began_is_refused() -> None:
    schedule = workflow_schedule(due=NOW + timedelta(seconds=30))
    stale = Schedule.objects.get(pk=schedule.pk)
    seen = schedule_settings(stale)  # what the edit began from
    schedules_enable(schedules=[schedule], enabled=False, now=NOW)  # another operator

    stale.description = "edited"
    with pytest.raises(ScheduleChanged):
        schedule_save(schedule=stale, changed=["description"], seen=seen, now=NOW)

    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.description) == (False, "")
    # the tick's own writes are not a change of settings: an edit that began before them saves
    schedules_enable(schedules=[schedule], enabled=True, now=NOW)
    fresh = Schedule.objects.get(pk=schedule.pk)
    seen = schedule_settings(fresh)
    schedules_tick(now=NOW + timedelta(seconds=61))
    fresh.description = "edited"
    schedule_save(schedule=fresh, changed=["description"], seen=seen, now=NOW)
    assert Schedule.objects.get(pk=schedule.pk).description == "edited"


def test_a_stored_timing_that_cannot_be_read_disables_the_schedule() -> None:
    schedule = workflow_schedule(due=NOW - timedelta(seconds=1), every=None, cron="* * * * *")
    Schedule.objects.filter(pk=schedule.pk).update(cron="61 * * * *")

    report = schedules_tick(now=NOW)

    assert report.disabled == ["echo"] and report.fired == []
    assert not Schedule.objects.get(pk=schedule.pk).enabled


def test_a_schedule_is_checked_with_the_field_at_fault() -> None:
    bad = Schedule(name="bad", cron="61 * * * *", timezone="Mars/Olympus", action="workflow", workflow="nope")
    incomplete = Schedule(name="incomplete", interval_seconds=0, action="submission", agent_kind="nope")

    with pytest.raises(ValidationError) as refused:
        bad.full_clean()
    assert set(refused.value.message_dict) == {"timezone", "workflow"}
    assert "no time zone is called 'Mars/Olympus'" in refused.value.message_dict["timezone"][0]

    with pytest.raises(ValidationError) as refused:
        incomplete.full_clean()
    assert set(refused.value.message_dict) == {"interval_seconds", "account", "agent_kind", "agent_name", "message"}
    assert "no agent kind 'nope'" in " ".join(refused.value.message_dict["agent_kind"])

    account_ensure(slug="acme", name="Acme")
    with_payload = submission_schedule(name="with-payload", due=None)
    with_payload.payload = {"ignored": True}  # it would be kept and never used
    with pytest.raises(ValidationError) as refused:
        with_payload.full_clean()
    assert refused.value.message_dict == {"payload": [ANY]} and "leave it empty" in str(refused.value)


def test_the_migration_installs_the_nightly_reconcile_and_the_first_tick_arms_it() -> None:
    Schedule.objects.filter(name="reconcile-nightly").delete()  # a flush may have removed it already
    migration = importlib.import_module("schedules.migrations.0002_install_reconcile_nightly")

    migration.install(apps, None)

    schedule = Schedule.objects.get(name="reconcile-nightly")
    schedule.full_clean()  # its workflow is registered, its expression valid
    assert (schedule.workflow, schedule.cron, schedule.enabled, schedule.next_due_at) == (
        "ledger.reconcile",
        "30 2 * * *",
        True,
        None,
    )
    schedules_tick(now=NOW)
    schedule.refresh_from_db()
    assert schedule.next_due_at == datetime(2025, 1, 7, 2, 30, tzinfo=UTC)


def test_purge_deletes_firings_due_before_the_retention_and_no_due_time_fires_again() -> None:
    # given a schedule every minute that fired 40 days ago and just now
    schedule = workflow_schedule(due=NOW - timedelta(days=40))
    schedules_tick(now=NOW - timedelta(days=40))
    schedule.refresh_from_db()
    schedule.next_due_at = NOW - timedelta(seconds=1)
    schedule.save(update_fields=["next_due_at"])
    schedules_tick(now=NOW)
    old, recent = firings(schedule)
    runs = WorkflowRun.objects.filter(idempotency_key__startswith="schedule:echo:").count()

    # when the firings older than 30 days are counted, then purged
    counted = firing_purge(older_than=timedelta(days=30), dry_run=True, now=NOW)
    purged = firing_purge(older_than=timedelta(days=30), now=NOW)

    # then only the old record is gone; the runs stay; and no tick fires the old due time again
    assert (counted.count, counted.dry_run, purged.count) == (1, True, 1)
    assert firings(schedule) == [recent]
    assert schedules_tick(now=NOW).fired == []
    assert WorkflowRun.objects.filter(idempotency_key__startswith="schedule:echo:").count() == runs == 2
    assert old.run_id is not None and WorkflowRun.objects.filter(pk=old.run_id).exists()
    with pytest.raises(ValueError, match="more than zero"):
        firing_purge(older_than=timedelta(0), now=NOW)
