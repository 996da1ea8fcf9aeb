"""``manage.py workflows {list,show,start,send-event,pause,resume,terminate,restart,sweep}``.

Thin over the services, the selectors and the sweeper. Bad input (an unknown id, malformed JSON,
an unknown workflow, a refused transition) ends in a CommandError with the reason, before or
instead of any write: every write is one service call that either commits or raises.
"""

from __future__ import annotations

import json
from argparse import ArgumentTypeError
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from workflows import services, sweeper
from workflows.apis.common import IDEMPOTENCY_KEY_MAX, idempotency_key_valid
from workflows.exceptions import WorkflowError
from workflows.management.base import ProjectCommand, json_option
from workflows.models import RunEvent, RunStatus, WorkflowRun
from workflows.selectors import describe_wait, run_attempts, run_events, run_get_any, run_list_all, run_timeline

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # AUTH_USER_MODEL, as the django-stubs plugin resolves it

CONTROLS: dict[str, tuple[Callable[..., WorkflowRun], str]] = {
    "pause": (services.run_pause, "Pause the run (a running run pauses at its next step boundary)."),
    "resume": (services.run_resume, "Resume a paused run, or withdraw a pending pause request."),
    "terminate": (services.run_terminate, "Stop the run for good."),
    "restart": (services.run_restart, "Start a new attempt from the first step; earlier attempts stay."),
}
CELL_CHARS = 60  # table cells longer than this are cut, so a row stays one line


def positive_int(text: str) -> int:
    """ASCII digits only: int() would also take "٥", " 5 " and "1_0"."""
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise ArgumentTypeError("must be at least 1")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ArgumentTypeError(f"{text!r} is not a whole number")
    value = int(text)
    if value < 1:
        raise ArgumentTypeError("must be at least 1")
    return value


class Command(ProjectCommand):
    help = "Inspect and control workflow runs; `workflows <subcommand> --help` describes each."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")

        listing = sub.add_parser("list", help="Runs, newest first.")
        listing.add_argument("--status", choices=RunStatus.values)
        listing.add_argument("--workflow", help="Only runs of this workflow name.")
        listing.add_argument("--limit", type=positive_int, default=50, help="At most this many rows (50).")

        show = sub.add_parser("show", help="One run, its step timeline, attempts and events.")
        show.add_argument("run_id")

        start = sub.add_parser("start", help="Start a run of a registered workflow.")
        start.add_argument("workflow")
        start.add_argument("--payload", default="{}", help="A JSON object (default {}).")
        start.add_argument("--idempotency-key", help="Starting again with this key returns the same run.")
        start.add_argument("--owner", help="Username of the run's owner (keys are scoped to the owner).")

        send = sub.add_parser("send-event", help="Send an event to a run; wakes it if it waits for the type.")
        send.add_argument("run_id")
        send.add_argument("type")
        send.add_argument("--payload", default="{}", help="JSON (default {}).")
        send.add_argument("--key", help="Idempotency key: sending again with it records no second event.")

        for name, (_, text) in CONTROLS.items():
            control = sub.add_parser(name, help=text)
            control.add_argument("run_id")
            if name == "restart":
                control.add_argument(
                    "--attempt",
                    type=positive_int,
                    help="The attempt to replace: refused if the run is on another now (restarted already).",
                )

        sub.add_parser("sweep", help="Fire due timers and re-enqueue lost runs once, as the beat task does.")

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand: str = options["subcommand"]
        try:
            if subcommand in CONTROLS:
                self.control(subcommand, options)
            else:
                getattr(self, "cmd_" + subcommand.replace("-", "_"))(options)
        except WorkflowError as exc:
            # UnknownWorkflow, InvalidPayload, IdempotencyConflict, TransitionNotAllowed: the
            # service raised before committing anything.
            raise CommandError(str(exc)) from None
        except WorkflowRun.DoesNotExist:
            # Found a moment ago, deleted before the service locked it.
            raise CommandError(f"no run with id {options.get('run_id')}") from None

    # --- reads ---
    def cmd_list(self, options: dict[str, Any]) -> None:
        runs = run_list_all(status=options["status"], workflow=options["workflow"])
        limit: int = options["limit"]
        page = list(runs[: limit + 1])  # one more tells whether there are more, without a COUNT
        if not page:
            self.stdout.write("No runs match.")
            return
        rows = [
            [
                str(run.id),
                run.workflow,
                _status(run),
                str(run.attempt),
                describe_wait(run, plain=True) or "-",
                _time(run.created_at),
            ]
            for run in page[:limit]
        ]
        self.stdout.write(table(["ID", "WORKFLOW", "STATUS", "ATTEMPT", "WAITING FOR", "CREATED"], rows))
        if len(page) > limit:
            self.stdout.write(f"(more runs match; showing the newest {limit}, see --limit)")

    def cmd_show(self, options: dict[str, Any]) -> None:
        run = get_run(options["run_id"])
        fields = [
            ("workflow", f"{run.workflow} (version {run.workflow_version or '-'})"),
            ("status", _status(run)),
            ("attempt", str(run.attempt)),
            ("owner", run.owner.get_username() if run.owner else "-"),
            ("idempotency key", run.idempotency_key or "-"),
            ("waiting for", describe_wait(run, plain=True) or "-"),
            ("current step", run.current_step or "-"),
            ("failure reason", run.failure_reason or "-"),
            ("recoveries", str(run.recovery_count)),
            ("created", _time(run.created_at)),
            ("started", _time(run.started_at)),
            ("finished", _time(run.finished_at)),
        ]
        self.stdout.write(f"Run {run.id}")
        self.stdout.write("\n".join(f"  {label:<16}{value}" for label, value in fields))
        for label, value in (("payload", run.payload), ("result", run.result), ("progress", run.progress)):
            if value is not None:
                self.stdout.write(f"\n{label.capitalize()}:\n{_indent(_pretty(value))}")
        if run.error:
            error = {key: value for key, value in run.error.items() if key != "traceback"}
            self.stdout.write(f"\nError:\n{_indent(_pretty(error))}")
            if run.error.get("traceback"):
                self.stdout.write(_indent(str(run.error["traceback"])))
        self.stdout.write("\nSteps (every attempt):")
        self.stdout.write(_indent(steps_table(run)))
        self.stdout.write("\nAttempts:")
        attempts = [[str(a.number), a.status, _time(a.started_at), _time(a.finished_at)] for a in run_attempts(run=run)]
        self.stdout.write(_indent(table(["#", "STATUS", "STARTED", "FINISHED"], attempts)))
        self.stdout.write("\nEvents:")
        self.stdout.write(_indent(events_table(list(run_events(run=run)))))

    # --- writes: one service call each ---
    def cmd_start(self, options: dict[str, Any]) -> None:
        payload = json_option(options["payload"], "--payload")
        # as the API's Idempotency-Key header: one run per key, either way
        key = checked_key(options["idempotency_key"], "--idempotency-key")
        owner = get_owner(options["owner"]) if options["owner"] else None
        services.check_startable(workflow=options["workflow"])
        run, created = services.run_start(
            workflow=options["workflow"], payload=payload, idempotency_key=key, owner=owner
        )
        if created:
            self.stdout.write(f"Started run {run.id} ({run.workflow}).")
        else:
            self.stdout.write(f"Run {run.id} ({run.workflow}) already exists for this key; it is {run.status}.")

    def cmd_send_event(self, options: dict[str, Any]) -> None:
        key = checked_key(options["key"], "--key")  # as the API's: the same form as a run's key
        run = get_run(options["run_id"])
        payload = json_option(options["payload"], "--payload")
        event, created = services.run_send_event(
            run_id=run.id, type=options["type"], payload=payload, idempotency_key=key
        )
        run.refresh_from_db()
        sent = "Sent" if created else "Already sent (same key):"
        self.stdout.write(f"{sent} event {event.type!r} (#{event.pk}) to run {run.id}; the run is {run.status}.")

    def control(self, action: str, options: dict[str, Any]) -> None:
        run = get_run(options["run_id"])
        service, _ = CONTROLS[action]
        extra = {"attempt": options["attempt"]} if options.get("attempt") is not None else {}
        run = service(run_id=run.id, **extra)
        if run.status == RunStatus.RUNNING and run.pause_requested:
            self.stdout.write(f"Run {run.id}: pause requested; it pauses at its next step boundary.")
        else:
            self.stdout.write(f"Run {run.id}: {action} done; it is {run.status} (attempt {run.attempt}).")

    def cmd_sweep(self, options: dict[str, Any]) -> None:
        report = sweeper.sweep()
        self.stdout.write(
            f"Swept in {report.seconds * 1000:.1f} ms: fired {_plural(report.timers_fired, 'timer')}, "
            f"re-enqueued {_plural(report.requeued, 'lost run')}."
        )


# --- input ---
def get_run(text: str) -> WorkflowRun:
    try:
        run_id = UUID(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a run id (a UUID such as the ones `workflows list` prints)") from None
    run = run_get_any(run_id=run_id)
    if run is None:
        raise CommandError(f"no run with id {run_id}")
    return run


def checked_key(key: str | None, option: str) -> str | None:
    """An idempotency key as the API takes one (``IDEMPOTENCY_KEY``), or None if not given."""
    if key is not None and not idempotency_key_valid(key):
        raise CommandError(
            f"{option} must be 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters, no space at either end"
        )
    return key


def get_owner(username: str) -> User:
    user_model = get_user_model()
    try:
        return user_model._default_manager.get_by_natural_key(username)
    except user_model.DoesNotExist:
        raise CommandError(f"no user named {username!r}") from None


# --- output ---
def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns as wide as their widest cell, a rule under the headers."""
    if not rows:
        return "(none)"
    cells = [[_cut(cell) for cell in row] for row in rows]
    widths = [max(len(str(h)), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *cells]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def steps_table(run: WorkflowRun) -> str:
    rows = [
        [
            str(s["attempt"]),
            str(s["position"]),
            s["name"],
            s["kind"],
            s["status"],
            str(s["tries"]),
            _time(s["started_at"]),
            _time(s["finished_at"]),
            _step_outcome(s),
        ]
        for s in run_timeline(run=run)
    ]
    return table(["ATTEMPT", "POS", "NAME", "KIND", "STATUS", "TRIES", "STARTED", "FINISHED", "RESULT / ERROR"], rows)


def events_table(events: list[RunEvent]) -> str:
    rows = [
        [
            str(e.pk),
            e.type,
            e.idempotency_key or "-",
            _time(e.created_at),
            f"attempt {e.consumed_attempt} step {e.consumed_position}" if e.consumed_at else "not consumed",
            json.dumps(e.payload, default=str),
        ]
        for e in events
    ]
    return table(["#", "TYPE", "KEY", "SENT", "CONSUMED BY", "PAYLOAD"], rows)


def _step_outcome(step: dict[str, Any]) -> str:
    if step["error"]:
        return f"{step['error'].get('type', 'Error')}: {step['error'].get('message', '')}"
    if step["status"] in ("sleeping", "waiting", "retrying", "running") and step["wake_at"]:
        return f"until {_time(step['wake_at'])}"
    return json.dumps(step["result"], default=str) if step["result"] is not None else "-"


def _status(run: WorkflowRun) -> str:
    return f"{run.status} (pause requested)" if run.pause_requested else str(run.status)


def _time(value: datetime | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def _cut(text: str) -> str:
    text = " ".join(str(text).split())  # one line per row, whatever a result or message holds
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
