"""``manage.py purge_records [--older-than 90d] [--dry-run]``: the retention policy of operational
records. Deletes only records created before the cutoff (default LEDGER_RETENTION_DAYS)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ledger.conf import conf
from ledger.durations import describe, duration_argument
from ledger.exceptions import InvalidOperation
from ledger.services import record_purge


class Command(BaseCommand):
    help = "Delete operational records older than the retention period."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration_argument,
            metavar="DURATION",
            help=f"Delete records older than this, e.g. 90d, 12w, 36h (default LEDGER_RETENTION_DAYS, now "
            f"{conf()['RETENTION_DAYS']}d).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = record_purge(older_than=options["older_than"], dry_run=options["dry_run"])
        except InvalidOperation as exc:
            raise CommandError(str(exc)) from None
        age = describe(options["older_than"]) if options["older_than"] is not None else f"{conf()['RETENTION_DAYS']}d"
        cutoff = timezone.localtime(result.cutoff).strftime("%Y-%m-%d %H:%M:%S")
        verb = "Would delete" if result.dry_run else "Deleted"
        self.stdout.write(f"{verb} {result.count} operational record(s) created before {cutoff} (older than {age}).")
        if result.dry_run:
            self.stdout.write("Dry run: nothing was deleted.")
