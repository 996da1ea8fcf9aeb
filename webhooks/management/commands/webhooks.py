"""``manage.py webhooks sources`` (the configured sources, no secrets) and ``manage.py webhooks
purge [--older-than 30d] [--dry-run]`` (the retention of delivery records)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ledger.durations import describe, duration_argument
from webhooks.selectors import source_summaries
from webhooks.services import delivery_purge


class Command(BaseCommand):
    help = "Inbound webhooks: list the configured sources, purge old delivery records."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True)
        commands.add_parser("sources", help="The configured sources: scheme, how many secrets, action.")
        purge = commands.add_parser("purge", help="Delete delivery records older than the retention period.")
        purge.add_argument(
            "--older-than",
            type=duration_argument,
            metavar="DURATION",
            help="Delete records received before this long ago, e.g. 30d, 12w, 36h (default "
            f"WEBHOOKS_RETENTION_DAYS, now {settings.WEBHOOKS_RETENTION_DAYS}d).",
        )
        purge.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["command"] == "sources":
            self.sources()
        else:
            self.purge(options)

    def sources(self) -> None:
        for source in source_summaries():
            problems = f"  PROBLEMS: {'; '.join(source['problems'])}" if source["problems"] else ""
            self.stdout.write(
                f"{source['name']}: {source['scheme']}, {source['secrets']} secret(s), {source['action']}{problems}"
            )

    def purge(self, options: dict[str, Any]) -> None:
        try:
            result = delivery_purge(older_than=options["older_than"], dry_run=options["dry_run"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        age = describe(options["older_than"]) if options["older_than"] is not None else None
        age = age or f"{settings.WEBHOOKS_RETENTION_DAYS}d"
        cutoff = timezone.localtime(result.cutoff).strftime("%Y-%m-%d %H:%M:%S")
        verb = "Would delete" if result.dry_run else "Deleted"
        self.stdout.write(
            f"{verb} {result.count} webhook delivery record(s) received before {cutoff} (older than {age})."
        )
        if result.dry_run:
            self.stdout.write("Dry run: nothing was deleted.")
