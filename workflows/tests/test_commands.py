"""``manage.py workflows``: reads print the right rows, writes go through the services, bad input
is a CommandError that changes nothing, and an event sent from the command wakes a real run."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.factories import Users, make_run
from tests.support import Worker, wait_for_status, wait_for_terminal
from workflows import public as wf
from workflows.models import RunAttempt, RunEvent, RunStatus, StepKind, StepResult, StepStatus, WorkflowRun

NO_RUN = "00000000-0000-0000-0000-000000000000"


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("workflows", *args, stdout=out)
    return out.getvalue()


def row_of(output: str, run: WorkflowRun) -> str:
    [row] = [line for line in output.splitlines() if line.startswith(str(run.pk))]
    return row


def snapshot() -> tuple[list[tuple[Any, ...]], int, int]:
    """Everything a refused command could have changed."""
    runs = list(WorkflowRun.objects.order_by("pk").values_list("pk", "status", "attempt", "updated_at"))
    return runs, RunEvent.objects.count(), RunAttempt.objects.count()


@pytest.mark.django_db
class TestReads:
    def test_list_prints_an_aligned_table_of_the_matching_runs(self) -> None:
        # given
        waiting = make_run(
            workflow="test.wait",
            status=RunStatus.WAITING,
            wait_event_type="reply",
            wait_step="wait for reply",
            wake_at=timezone.now() + timedelta(minutes=5),
        )
        done = make_run(workflow="test.echo", status=RunStatus.COMPLETED, attempt=2)

        # when
        everything = run_command("list")
        only_waiting = run_command("list", "--status", "waiting")
        only_echo = run_command("list", "--workflow", "test.echo")

        # then
        header, rule, *_ = everything.splitlines()
        assert header.split() == ["ID", "WORKFLOW", "STATUS", "ATTEMPT", "WAITING", "FOR", "CREATED"]
        assert set(rule) == {"-", " "}
        assert row_of(everything, done).split()[:4] == [str(done.pk), "test.echo", "completed", "2"]
        assert "event 'reply' until" in row_of(everything, waiting)
        # aligned: every row's status column starts where the header's does
        column = header.index("STATUS")
        assert all(
            line[column:].split()[0] in ("STATUS", "waiting", "completed")
            for line in everything.splitlines()
            if not line.startswith("-")
        )
        assert str(waiting.pk) in only_waiting and str(done.pk) not in only_waiting
        assert str(done.pk) in only_echo and str(waiting.pk) not in only_echo

    def test_list_limit_and_empty(self) -> None:
        runs = [make_run(status=RunStatus.QUEUED) for _ in range(3)]

        limited = run_command("list", "--limit", "2")

        assert sum(str(run.pk) in limited for run in runs) == 2
        assert "showing the newest 2" in limited
        assert run_command("list", "--status", "paused") == "No runs match.\n"

    def test_show_prints_the_run_and_its_step_timeline(self) -> None:
        # given: attempt 1 failed at "charge", attempt 2 is sleeping
        run = make_run(
            workflow="test.sleep",
            status=RunStatus.SLEEPING,
            attempt=2,
            payload={"seconds": 60},
            wait_step="nap",
            wake_at=timezone.now() + timedelta(minutes=1),
        )
        for attempt, position, name, kind, status in [
            (1, 1, "before", StepKind.DO, StepStatus.COMPLETED),
            (1, 2, "charge", StepKind.DO, StepStatus.FAILED),
            (2, 1, "before", StepKind.DO, StepStatus.COMPLETED),
            (2, 2, "nap", StepKind.SLEEP, StepStatus.SLEEPING),
        ]:
            StepResult.objects.create(
                run=run,
                attempt=attempt,
                position=position,
                name=name,
                kind=kind,
                status=status,
                result=1234.5 if status == StepStatus.COMPLETED else None,
                error={"type": "ValueError", "message": "card declined"} if status == StepStatus.FAILED else None,
            )
        RunEvent.objects.create(run=run, type="reply", payload={"text": "hi"})

        # when
        output = run_command("show", str(run.pk))

        # then
        assert output.startswith(f"Run {run.pk}\n")
        assert "  status          sleeping" in output
        assert "sleep 'nap' until" in output
        assert '"seconds": 60' in output
        steps = output.split("Steps (every attempt):")[1].split("Attempts:")[0].splitlines()
        rows = [line.split()[:5] for line in steps if line.strip() and line.split()[0].isdigit()]
        assert rows == [
            ["1", "1", "before", "do", "completed"],
            ["1", "2", "charge", "do", "failed"],
            ["2", "1", "before", "do", "completed"],
            ["2", "2", "nap", "sleep", "sleeping"],
        ]
        assert "ValueError: card declined" in output
        assert "reply" in output.split("Events:")[1]


@pytest.mark.django_db
class TestWrites:
    def test_start_creates_a_run_once_per_key(self, users: Users) -> None:
        first = run_command(
            "start", "test.echo", "--payload", '{"n": 1}', "--idempotency-key", "k1", "--owner", "alice"
        )
        again = run_command(
            "start", "test.echo", "--payload", '{"n": 1}', "--idempotency-key", "k1", "--owner", "alice"
        )

        run = WorkflowRun.objects.get()
        assert (run.workflow, run.payload, run.owner, run.status) == ("test.echo", {"n": 1}, users.alice, "queued")
        assert first == f"Started run {run.pk} (test.echo).\n"
        assert f"Run {run.pk} (test.echo) already exists for this key" in again

    def test_controls_go_through_the_services(self) -> None:
        run = make_run(workflow="test.wait", status=RunStatus.WAITING, wait_event_type="reply", wake_at=timezone.now())

        paused = run_command("pause", str(run.pk))
        run.refresh_from_db()
        assert run.status == RunStatus.PAUSED
        assert paused == f"Run {run.pk}: pause done; it is paused (attempt 1).\n"

        run_command("resume", str(run.pk))
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED

        run_command("restart", str(run.pk), "--attempt", "1")
        with pytest.raises(CommandError, match="it is on attempt 2 now, not attempt 1"):
            run_command("restart", str(run.pk), "--attempt", "1")  # sent twice: once
        run_command("terminate", str(run.pk))
        run.refresh_from_db()
        assert (run.status, run.attempt) == (RunStatus.TERMINATED, 2)

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["show", "not-a-uuid"], "'not-a-uuid' is not a run id"),
            (["pause", "00000000-0000-0000-0000-000000000000"], "no run with id 00000000-0000-0000-0000-000000000000"),
            (["start", "test.echo", "--payload", "{not json"], "--payload is not valid JSON"),
            (["start", "test.echo", "--payload", "[1, 2]"], "payload must be a JSON object, not list"),
            (["start", "no.such.workflow"], "no workflow is registered as 'no.such.workflow'"),
            (
                ["start", "refund", "--payload", '{"request_id": 1, "order": "1"}'],
                "workflow 'refund' cannot be started directly",
            ),
            (
                ["start", "test.lines", "--payload", '{"path": "/tmp/x", "steps": 1}'],
                "workflow 'test.lines' cannot be started directly",
            ),
            (
                ["start", "agents.turn", "--payload", '{"turn": "00000000-0000-0000-0000-000000000000"}'],
                "workflow 'agents.turn' cannot be started directly: its own app starts it",
            ),
            (["start", "test.echo", "--owner", "nobody"], "no user named 'nobody'"),
            (["start", "test.echo", "--idempotency-key", " a "], "--idempotency-key must be 1 to 255 printable"),
            (["start", "test.echo", "--idempotency-key", "caf\u00e9"], "--idempotency-key must be 1 to 255"),
            (["send-event", NO_RUN, "reply", "--key", "k\n"], "--key must be 1 to 255 printable ASCII"),
            # Python 3.11's argparse reads "--option=--" as an empty list: refused for every option
            (["send-event", NO_RUN, "reply", "--key=--"], "--key cannot take '--' as its value"),
            (["start", "test.echo", "--payload=--"], "--payload cannot take '--' as its value"),
            (["start", "test.echo", "--owner=--"], "--owner cannot take '--' as its value"),
            (["list", "--limit=--"], "--limit cannot take '--' as its value"),
            (["start", "test.echo", "--payload", "[" * 5000 + "]" * 5000], "--payload is not valid JSON: it is nested"),
            (["start", "test.echo", "--payload", '{"x": NaN}'], "--payload is not valid JSON: NaN is not JSON"),
            (["list", "--status", "asleep"], "invalid choice: 'asleep'"),
            (["list", "--limit", "0"], "must be at least 1"),
            (["list", "--limit=-1"], "must be at least 1"),  # a whole number, too small
            (["restart", NO_RUN, "--attempt", "\u0665"], "'\u0665' is not a whole number"),  # an Arabic-Indic 5
            (["restart", NO_RUN, "--attempt", " 1"], "' 1' is not a whole number"),
        ],
    )
    def test_bad_input_is_a_command_error_and_changes_nothing(self, args: list[str], message: str) -> None:
        make_run(status=RunStatus.QUEUED)
        before = snapshot()

        with pytest.raises(CommandError, match=re.escape(message)):
            run_command(*args)

        assert snapshot() == before

    def test_refused_transition_is_a_command_error_and_changes_nothing(self) -> None:
        run = make_run(workflow="test.echo", status=RunStatus.COMPLETED)
        before = snapshot()

        with pytest.raises(CommandError, match="cannot resume a run that is completed"):
            run_command("resume", str(run.pk))
        with pytest.raises(CommandError, match="the run is completed; it takes no more events"):
            run_command("send-event", str(run.pk), "reply")

        assert snapshot() == before

    def test_send_event_with_malformed_payload_records_nothing(self) -> None:
        run = make_run(workflow="test.wait", status=RunStatus.WAITING, wait_event_type="reply", wake_at=timezone.now())
        before = snapshot()

        with pytest.raises(CommandError, match="--payload is not valid JSON"):
            run_command("send-event", str(run.pk), "reply", "--payload", "{'single': 'quotes'}")

        assert snapshot() == before

    def test_sweep_reports_the_timers_it_fired(self) -> None:
        # given: a run whose sleep is over and one still asleep. Both rows stay inside this test's
        # transaction, so the beat sweeper of a worker another test started cannot fire them first.
        due = make_run(
            workflow="test.sleep",
            status=RunStatus.SLEEPING,
            wait_step="nap",
            wake_at=timezone.now() - timedelta(seconds=5),
        )
        later = make_run(
            workflow="test.sleep",
            status=RunStatus.SLEEPING,
            wait_step="nap",
            wake_at=timezone.now() + timedelta(hours=1),
        )

        # when
        output = run_command("sweep")

        # then
        assert output.startswith("Swept in ")
        assert "fired 1 timer," in output
        due.refresh_from_db()
        later.refresh_from_db()
        assert (due.status, due.wake_at) == (RunStatus.QUEUED, None)
        assert later.status == RunStatus.SLEEPING


@pytest.mark.django_db(transaction=True)
def test_send_event_wakes_a_waiting_run_that_a_worker_completes(worker: Worker) -> None:
    # given: a real run, suspended by a real worker on its wait step
    run = wf.start("test.wait", {"timeout": 120})
    waiting = wait_for_status(run.id, RunStatus.WAITING, timeout=60)
    assert waiting.wait_event_type == "reply"

    # when
    output = run_command("send-event", str(run.pk), "reply", "--payload", '{"text": "yes"}', "--key", "r1")
    repeat = run_command("send-event", str(run.pk), "reply", "--payload", '{"text": "yes"}', "--key", "r1")

    # then
    assert "Sent event 'reply'" in output and f"to run {run.pk}; the run is " in output
    assert "Already sent (same key)" in repeat
    finished = wait_for_terminal(run.id, timeout=60)
    assert finished.status == RunStatus.COMPLETED, finished.error
    assert finished.result is not None
    assert finished.result["reply"] == {"text": "yes"}
    assert RunEvent.objects.filter(run=run).count() == 1
    assert "completed" in row_of(run_command("list"), run)
