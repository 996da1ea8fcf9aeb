"""``manage.py purge_records [--older-than 90d] [--dry-run]``: the retention policy of operational
records. Deletes only records created before the cutoff (default LEDGER_RETENTION_DAYS)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ledger.conf import conf
from ledger.durations import add_retention_arguments, purge_report
from ledger.exceptions import InvalidOperation
from ledger.services import record_purge
from workflows.management.base import ProjectCommand


class Command(ProjectCommand):
    help = "Delete operational records older than the retention period."

    def add_arguments(self, parser: CommandParser) -> None:
        days = conf()["RETENTION_DAYS"]
        add_retention_arguments(parser, which="records created", setting="LEDGER_RETENTION_DAYS", days=days)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = record_purge(older_than=options["older_than"], dry_run=options["dry_run"])
        except InvalidOperation as exc:
            raise CommandError(str(exc)) from None
        for line in purge_report(
            deleted=f"{result.count} operational record(s) created",
            cutoff=result.cutoff,
            dry_run=result.dry_run,
            older_than=options["older_than"],
            default_days=conf()["RETENTION_DAYS"],
        ):
            self.stdout.write(line)
