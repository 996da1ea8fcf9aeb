"""``manage.py schedules list|tick|enable NAME|disable NAME|fire NAME|add NAME ...|remove NAME|purge``.

``tick`` does once what beat's ``schedules-tick`` does every SCHEDULES_TICK_INTERVAL seconds;
``fire`` is the admin's "fire now". ``add`` takes ``--cron EXPR`` or ``--every DURATION``, and
``--workflow NAME [--payload JSON]`` or ``--account SLUG --kind KIND --agent NAME --message TEXT``.
``purge [--older-than 30d] [--dry-run]`` deletes firing records due longer ago (the retention,
SCHEDULES_RETENTION_DAYS). Bad input stops with an error and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from ledger.durations import add_retention_arguments, duration_argument, purge_report
from schedules.models import Action, Schedule, ScheduleFiring
from schedules.services import firing_purge, schedule_fire, schedule_save, schedules_enable, schedules_tick
from workflows.management.base import ProjectCommand, json_option


def _when(value: Any) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z") if value else "-"


class Command(ProjectCommand):
    help = "Schedules: list them, tick once, enable, disable, fire now, add or remove one, purge old firings."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        sub.add_parser("list", help="Every schedule: name, enabled, when, what, next due, last fired.")
        sub.add_parser("tick", help="Fire the schedules due now, once (what beat does every few seconds).")
        for name, text in (
            ("enable", "Enable a schedule; it is next due from now (what it missed is not fired)."),
            ("disable", "Disable a schedule."),
            ("fire", "Fire a schedule now, enabled or not (a firing due now)."),
            ("remove", "Delete a schedule and its firings (the runs and submissions stay)."),
        ):
            sub.add_parser(name, help=text).add_argument("name")
        add = sub.add_parser("add", help="Add a schedule (checked as the admin checks it).")
        add.add_argument("name", help="A slug: letters, digits, - and _.")
        when = add.add_mutually_exclusive_group(required=True)
        when.add_argument("--cron", help="Five fields, e.g. '30 2 * * *' (minute hour day month weekday), or @daily.")
        when.add_argument("--every", type=duration_argument, metavar="DURATION", help="An interval, e.g. 30s, 10m, 1h.")
        add.add_argument("--timezone", default=settings.TIME_ZONE, help="The cron's time zone (default TIME_ZONE).")
        add.add_argument("--workflow", help="Start this workflow at each firing.")
        add.add_argument("--payload", help="The run's payload, a JSON object (a --workflow schedule's only).")
        add.add_argument("--account", help="Or submit a message to an agent of this account (slug) ...")
        add.add_argument("--kind", help="... of this agent kind ...")
        add.add_argument("--agent", help="... and this name (the conversation) ...")
        add.add_argument("--message", help="... with this text.")
        add.add_argument("--description", default="")
        add.add_argument("--disabled", action="store_true", help="Add it disabled.")
        purge = sub.add_parser("purge", help="Delete firing records older than the retention period.")
        days = settings.SCHEDULES_RETENTION_DAYS
        add_retention_arguments(purge, which="firings due", setting="SCHEDULES_RETENTION_DAYS", days=days)

    def handle(self, *args: Any, **options: Any) -> None:
        command = options["subcommand"]
        if command == "list":
            return self.list()
        if command == "tick":
            return self.tick()
        if command == "add":
            return self.add(options)
        if command == "purge":
            return self.purge(options)
        schedule = self.schedule(options["name"])
        if command == "fire":
            return self.fire(schedule)
        if command == "remove":
            count = ScheduleFiring.objects.filter(schedule=schedule).count()
            schedule.delete()
            self.stdout.write(f"Removed {schedule.name} and its {count} firing(s).")
            return None
        enabled = command == "enable"
        changed = schedules_enable(schedules=[schedule], enabled=enabled)
        schedule.refresh_from_db()
        state = "enabled" if enabled else "disabled"
        note = f"; next due {_when(schedule.next_due_at)}" if enabled else ""
        self.stdout.write(f"{schedule.name} {state}{note}." if changed else f"{schedule.name} was {state} already.")
        return None

    def schedule(self, name: str) -> Schedule:
        try:
            return Schedule.objects.get(name=name)
        except Schedule.DoesNotExist:
            known = ", ".join(Schedule.objects.values_list("name", flat=True)[:20]) or "none"
            raise CommandError(f"no schedule {name!r} (schedules: {known})") from None

    def list(self) -> None:
        schedules = list(Schedule.objects.order_by("name"))
        if not schedules:
            self.stdout.write("No schedules.")
        for s in schedules:
            self.stdout.write(
                f"{s.name}\t{'enabled' if s.enabled else 'disabled'}\t{s.describe_spec()}\t{s.describe_action()}"
                f"\tnext {_when(s.next_due_at)}\tlast {_when(s.last_fired_at)}"
            )

    def tick(self) -> None:
        report = schedules_tick()
        for firing in report.fired:
            what = firing.error if firing.error else (firing.run_id or f"submission {firing.submission_id}")
            self.stdout.write(f"{firing.schedule.name}\tdue {_when(firing.due_at)}\t{firing.outcome}\t{what}")
        for name in report.disabled:
            self.stderr.write(f"{name}: disabled, its stored timing is invalid (see the log)")
        self.stdout.write(f"Fired {len(report.fired)}; worked out the first due time of {report.armed}.")

    def purge(self, options: dict[str, Any]) -> None:
        try:
            result = firing_purge(older_than=options["older_than"], dry_run=options["dry_run"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for line in purge_report(
            deleted=f"{result.count} schedule firing record(s) due",
            cutoff=result.cutoff,
            dry_run=result.dry_run,
            older_than=options["older_than"],
            default_days=settings.SCHEDULES_RETENTION_DAYS,
        ):
            self.stdout.write(line)

    def fire(self, schedule: Schedule) -> None:
        firing = schedule_fire(schedule=schedule)
        if firing is None:
            raise CommandError(f"{schedule.name} fired at this instant already")
        if firing.outcome == "failed":
            raise CommandError(f"{schedule.name}: the firing failed: {firing.error}")
        what = f"run {firing.run_id}" if firing.run_id else f"submission {firing.submission_id}"
        self.stdout.write(f"{schedule.name} fired: {firing.outcome}, {what} (key {firing.idempotency_key}).")

    def add(self, options: dict[str, Any]) -> None:
        # Given at all, not true: an empty --message is refused below for being empty, not unnamed.
        submission = [options[k] is not None for k in ("account", "kind", "agent", "message")]
        if options["workflow"] and any(submission):
            raise CommandError("give either --workflow or --account/--kind/--agent/--message, not both")
        if not options["workflow"] and not all(submission):
            raise CommandError("give --workflow NAME, or all of --account, --kind, --agent and --message")
        if options["payload"] is not None and not options["workflow"]:
            # Even "{}": the option is the workflow's, and a submission sends its message.
            raise CommandError("--payload is a workflow's: a submission sends its --message")
        payload = json_option(options["payload"] or "{}", "--payload")
        every = options["every"]
        schedule = Schedule(
            name=options["name"],
            description=options["description"],
            enabled=not options["disabled"],
            cron=options["cron"] or "",
            interval_seconds=int(every.total_seconds()) if every is not None else None,
            timezone=options["timezone"],
            action=Action.WORKFLOW if options["workflow"] else Action.SUBMISSION,
            workflow=options["workflow"] or "",
            payload=payload,
            account=options["account"] or "",
            agent_kind=options["kind"] or "",
            agent_name=options["agent"] or "",
            message=options["message"] or "",
        )
        try:
            schedule.full_clean()
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())
            raise CommandError(problems) from None
        schedule_save(schedule=schedule)
        self.stdout.write(
            f"Added {schedule.name}: {schedule.describe_spec()}, {schedule.describe_action()}, "
            f"next due {_when(schedule.next_due_at)}."
        )
