"""``manage.py reconcile [--system S] [--older-than 10m] [--dry-run]``.

Looks up every unknown operation and every stale submitted one at its provider and records what
it says; prints one row per operation (key, system, before → after, note) and flags those that
still need a person. ``--dry-run`` looks up (a read at the provider) and changes nothing here.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ledger.adapters import has_adapter, unknown_system_message
from ledger.durations import describe, duration_argument
from ledger.management.tables import table
from ledger.models import ExternalOperation
from ledger.services import ReconcileResult, operations_reconcile
from workflows.management.base import ProjectCommand


class Command(ProjectCommand):
    help = "Resolve unknown and stale submitted external operations by looking them up at their provider."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--system", help="Only operations of this system (e.g. payments).")
        parser.add_argument(
            "--older-than",
            type=duration_argument,
            metavar="DURATION",
            help="Only operations last sent more than this long ago, e.g. 30s, 10m, 2h, 90d. Default: every "
            "unknown one, and submits older than LEDGER_STALE_SUBMITTED_SECONDS.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Look up and report; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run: bool = options["dry_run"]
        # A system without an adapter is a typo, or one whose app is no longer installed: its
        # recorded operations are listed (flagged: they cannot be looked up); none is an error, so
        # that a typo in a scheduled job does not pass for "nothing to reconcile".
        unknown = (system := options["system"]) and not has_adapter(system)
        if unknown and not ExternalOperation.objects.filter(system=system).exists():
            raise CommandError(f"{unknown_system_message(system)}, and no operation of it is recorded")
        if unknown:
            warning = f"{unknown_system_message(system)}: its operations cannot be looked up"
            self.stderr.write(self.style.WARNING(warning))
        results = operations_reconcile(system=options["system"], older_than=options["older_than"], dry_run=dry_run)
        scope = f" of {options['system']}" if options["system"] else ""
        if options["older_than"] is not None:
            scope += f" sent more than {describe(options['older_than'])} ago"
        if not results:
            self.stdout.write(f"Nothing to reconcile: no unknown or stale submitted operations{scope}.")
            return
        self.stdout.write(table(["", "KEY", "SYSTEM", "BEFORE → AFTER", "NOTE"], [_row(r) for r in results]))
        self.stdout.write("")
        self.stdout.write(_summary(results, dry_run=dry_run))
        flagged = [r for r in results if r.verdict == "flagged"]
        if flagged:
            self.stdout.write(
                self.style.WARNING(
                    f"{len(flagged)} need a person (marked !): resolve them in the admin (External operations, "
                    "filter “needs attention”) once you know the outcome."
                )
            )


def _row(result: ReconcileResult) -> list[str]:
    arrow = "would be" if result.dry_run and result.after != result.before else "→"
    mark = {"flagged": "!", "resolved": "✓", "skipped": "-"}[result.verdict]
    return [mark, result.key, result.system, f"{result.before} {arrow} {result.after}", result.note]


def _summary(results: list[ReconcileResult], *, dry_run: bool) -> str:
    counts = {
        verdict: sum(1 for r in results if r.verdict == verdict) for verdict in ("resolved", "flagged", "skipped")
    }
    text = (
        f"{len(results)} operation(s): {counts['resolved']} resolved, {counts['flagged']} flagged, "
        f"{counts['skipped']} skipped."
    )
    return f"Dry run, nothing changed. {text.replace('resolved', 'would be resolved')}" if dry_run else text
