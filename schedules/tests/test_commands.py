"""``manage.py schedules``: list, tick, enable, disable, fire, add, remove; bad input is a
CommandError that changes nothing."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from schedules.models import Outcome, Schedule, ScheduleFiring, Trigger
from schedules.tests.support import workflow_schedule
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("schedules", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_add_list_disable_enable_fire_remove() -> None:
    out = run("add", "nightly-echo", "--cron", "15 3 * * *", "--timezone", "Europe/London", "--workflow", "test.echo")
    assert "Added nightly-echo: cron 15 3 * * * (Europe/London), start test.echo, next due" in out
    schedule = Schedule.objects.get(name="nightly-echo")
    assert schedule.enabled and schedule.next_due_at is not None and schedule.next_due_at > timezone.now()

    listed = run("list")
    assert "nightly-echo\tenabled\tcron 15 3 * * * (Europe/London)\tstart test.echo\tnext " in listed

    assert run("disable", "nightly-echo") == "nightly-echo disabled.\n"
    assert run("disable", "nightly-echo") == "nightly-echo was disabled already.\n"
    assert "nightly-echo enabled; next due " in run("enable", "nightly-echo")

    fired = run("fire", "nightly-echo")
    firing = ScheduleFiring.objects.get(schedule__name="nightly-echo")
    assert f"nightly-echo fired: started, run {firing.run_id}" in fired
    run_id = firing.run_id
    assert firing.trigger == Trigger.MANUAL and run_id is not None and WorkflowRun.objects.filter(pk=run_id).exists()

    assert run("remove", "nightly-echo") == "Removed nightly-echo and its 1 firing(s).\n"
    assert not Schedule.objects.filter(name="nightly-echo").exists()
    assert WorkflowRun.objects.filter(pk=run_id).exists()  # the run stays


def test_tick_fires_what_is_due() -> None:
    schedule = workflow_schedule(due=timezone.now() - timedelta(seconds=1), every=30)

    out = run("tick")

    [firing] = ScheduleFiring.objects.filter(schedule=schedule)
    assert firing.outcome == Outcome.STARTED
    assert "echo\tdue " in out and f"started\t{firing.run_id}" in out and "Fired 1;" in out


def test_add_a_submission_every_hour() -> None:
    from accounts.services import account_ensure

    account_ensure(slug="acme")
    out = run(
        "add", "remind", "--every", "1h", "--account", "acme", "--kind", "test.chat", "--agent", "reminders",
        "--message", "Re-assess the suppliers.", "--disabled",
    )  # fmt: skip

    assert "Added remind: every 1h, submit to acme/test.chat/reminders" in out
    schedule = Schedule.objects.get(name="remind")
    assert (schedule.interval_seconds, schedule.enabled, schedule.next_due_at) == (3600, False, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enable", "nope"], "no schedule 'nope'"),
        (["fire", "nope"], "no schedule 'nope'"),
        (["add", "x", "--cron", "61 * * * *", "--workflow", "test.echo"], "cron: minute: 61 is out of range 0-59"),
        (["add", "x", "--every", "0s", "--workflow", "test.echo"], "interval_seconds: an interval is 1 to"),
        (["add", "x", "--cron", "@daily", "--workflow", "nope"], "registered as 'nope' in this process"),
        (["add", "x", "--cron", "@daily", "--timezone", "Mars/Base", "--workflow", "test.echo"], "timezone: no time"),
        (["add", "x", "--cron", "@daily", "--workflow", "test.echo", "--payload", "[1"], "--payload is not valid JSON"),
        (["add", "x", "--cron", "@daily", "--workflow", "test.echo", "--payload", "[1]"], "payload"),
        (["add", "x", "--cron", "@daily"], "give --workflow NAME, or all of"),
        (["add", "x", "--cron", "@daily", "--account", "acme", "--kind", "test.chat", "--agent", "a",
          "--message", "m", "--payload", "{}"], "--payload is a workflow's"),
        (["add", "x", "--cron", "@daily", "--workflow", "w", "--account", "a"], "not both"),
        (["add", "x", "--cron", "@daily", "--account", "nobody", "--kind", "test.chat", "--agent", "a",
          "--message", "m"], "account: no account 'nobody'"),
        (["add", "Not A Slug", "--cron", "@daily", "--workflow", "test.echo"], "name:"),
    ],
)  # fmt: skip
def test_bad_input_is_an_error_that_changes_nothing(args: list[str], message: str) -> None:
    before = set(Schedule.objects.values_list("name", flat=True))

    with pytest.raises(CommandError, match=message.replace("*", r"\*")):
        run(*args)

    assert set(Schedule.objects.values_list("name", flat=True)) == before
    assert not ScheduleFiring.objects.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--workflow", "ledger.reconcile", "--payload", '{"bogus": 1}'], "payload: unknown keys: bogus"),
        (
            ["--workflow", "agents.turn", "--payload", '{"turn": "00000000-0000-0000-0000-000000000000"}'],
            "workflow: workflow 'agents.turn' is started only by its own app",
        ),
        (["--account", "acme", "--kind", "test.chat", "--agent", "a", "--message", " "], "message: the message is em"),
        (["--account", "acme", "--kind", "test.chat", "--agent", "a", "--message", ""], "message: required"),
        (
            ["--account", "acme", "--kind", "test.chat", "--agent", "a", "--message", "x" * 5000],
            "message: the message is 5,000 characters; the limit is",
        ),
    ],
)  # fmt: skip
def test_work_every_firing_would_refuse_is_refused_when_added(change: list[str], message: str) -> None:
    # given a schedule whose work is well formed but which every firing would refuse (its
    # workflow's validate_payload, the chat's rules for a message)
    from accounts.services import account_ensure

    account_ensure(slug="acme")

    # then it is refused when added, saying why, and nothing is added
    with pytest.raises(CommandError, match=message):
        run("add", "x", "--cron", "@daily", *change)
    assert not Schedule.objects.filter(name="x").exists()


def test_fire_reports_a_failed_firing_as_an_error() -> None:
    workflow_schedule("broken", due=None, workflow="ledger.reconcile", payload={"bogus": 1})

    with pytest.raises(CommandError, match="broken: the firing failed: InvalidPayload: unknown keys: bogus"):
        run("fire", "broken")
    assert ScheduleFiring.objects.get().outcome == Outcome.FAILED


def test_purge_deletes_old_firings_and_a_dry_run_only_counts() -> None:
    schedule = workflow_schedule(due=timezone.now() - timedelta(days=60))
    ScheduleFiring.objects.create(
        schedule=schedule, due_at=timezone.now() - timedelta(days=60), outcome=Outcome.STARTED, idempotency_key="a"
    )
    ScheduleFiring.objects.create(
        schedule=schedule, due_at=timezone.now() - timedelta(days=1), outcome=Outcome.STARTED, idempotency_key="b"
    )

    dry = run("purge", "--dry-run")
    assert "Would delete 1 schedule firing record(s) due before " in dry and "(older than 30d)" in dry
    assert "Dry run: nothing was deleted." in dry and ScheduleFiring.objects.count() == 2

    assert "Deleted 1 schedule firing record(s)" in run("purge")
    assert list(ScheduleFiring.objects.values_list("idempotency_key", flat=True)) == ["b"]
    assert "Deleted 1 " in run("purge", "--older-than", "12h")
    with pytest.raises(CommandError, match="more than zero"):
        run("purge", "--older-than", "0d")
    with pytest.raises(CommandError, match="before the year 1"):
        run("purge", "--older-than", "999999w")
    assert list(ScheduleFiring.objects.values_list("idempotency_key", flat=True)) == []
