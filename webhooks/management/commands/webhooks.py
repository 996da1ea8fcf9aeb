"""``manage.py webhooks sources`` (the configured sources, no secrets), ``manage.py webhooks
purge [--older-than 30d] [--dry-run] [--include-failed]`` (the retention of delivery records:
never a pending action, a failed one only when asked), and for sources that
act later ``manage.py webhooks sweep`` (send lost actions again, as beat does) and ``manage.py
webhooks act-again <delivery id> ...`` (failed or pending actions tried now)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from ledger.durations import add_retention_arguments, purge_report
from webhooks.selectors import delivery_ids_among, source_summaries
from webhooks.services import delivery_act_again, delivery_purge, delivery_sweep
from workflows.management.base import ProjectCommand


class Command(ProjectCommand):
    help = "Inbound webhooks: list the configured sources, purge old delivery records."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True)
        commands.add_parser("sources", help="The configured sources: scheme, how many secrets, action.")
        purge = commands.add_parser("purge", help="Delete delivery records older than the retention period.")
        days = settings.WEBHOOKS_RETENTION_DAYS
        add_retention_arguments(purge, which="records received", setting="WEBHOOKS_RETENTION_DAYS", days=days)
        purge.add_argument(
            "--include-failed",
            action="store_true",
            help="Delete old deliveries whose action failed too (kept by default, to be acted on again).",
        )
        commands.add_parser("sweep", help="Send the actions of pending deliveries whose task was lost again.")
        again = commands.add_parser(
            "act-again",
            help="Act now on failed deliveries (their tries from 0) or pending ones (their back-off cut short).",
        )
        again.add_argument("ids", nargs="+", type=int, metavar="delivery_id")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["command"] == "sources":
            self.sources()
        elif options["command"] == "sweep":
            self.stdout.write(f"{delivery_sweep()} overdue action(s) sent again")
        elif options["command"] == "act-again":
            wanted = set(options["ids"])
            acted = set(delivery_act_again(sorted(wanted), by="manage.py webhooks act-again"))
            self.stdout.write(f"{len(acted)} delivery(ies) will be acted on now")
            found = acted if acted == wanted else delivery_ids_among(wanted)
            if missing := sorted(wanted - found):
                self.stderr.write(f"no delivery {', '.join(map(str, missing))}")
            if left := sorted(found - acted):
                listed = ", ".join(map(str, left))
                self.stderr.write(f"{listed}: neither failed nor pending, or a try is acting now: left as they were")
            if missing or not acted:  # a script sees that it did not do what it was asked
                raise CommandError("no such delivery" if missing else "nothing to act on")
        else:
            self.purge(options)

    def sources(self) -> None:
        if not (summaries := source_summaries()):
            self.stdout.write("No webhook source is configured (WEBHOOK_SOURCES_JSON).")
        for source in summaries:
            problems = f"  PROBLEMS: {'; '.join(source['problems'])}" if source["problems"] else ""
            self.stdout.write(
                f"{source['name']}: {source['scheme']}, {source['secrets']} secret(s), {source['action']},"
                f" acts {source['act']}{problems}"
            )

    def purge(self, options: dict[str, Any]) -> None:
        try:
            result = delivery_purge(
                older_than=options["older_than"], dry_run=options["dry_run"], include_failed=options["include_failed"]
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for line in purge_report(
            deleted=f"{result.count} webhook delivery record(s) received",
            cutoff=result.cutoff,
            dry_run=result.dry_run,
            older_than=options["older_than"],
            default_days=settings.WEBHOOKS_RETENTION_DAYS,
        ):
            self.stdout.write(line)
        kept = "Would keep" if result.dry_run else "Kept"
        if result.kept_pending:
            pending = result.kept_pending
            self.stdout.write(f"{kept} {pending} older delivery(ies) whose action is pending (work not yet done).")
        if result.kept_failed:
            self.stdout.write(
                f"{kept} {result.kept_failed} older delivery(ies) whose action failed: act on them again "
                "(webhooks act-again <id>, or the admin), or delete them with --include-failed."
            )
