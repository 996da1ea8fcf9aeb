"""``manage.py approvals {list,sweep}``: the pending queue, and the orphan sweep."""

from __future__ import annotations

from django.core.management.base import CommandParser
from django.utils import timezone
from django.utils.timesince import timesince

from approvals import services
from approvals.models import ApprovalStatus
from approvals.selectors import approval_queue
from workflows.management.base import ProjectCommand


class Command(ProjectCommand):
    help = "Approval requests: `approvals list` shows the queue, `approvals sweep` cancels orphans."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        listing = sub.add_parser("list", help="Requests, oldest first (pending by default).")
        listing.add_argument("--status", choices=ApprovalStatus.values, default=ApprovalStatus.PENDING)
        sub.add_parser("sweep", help="Cancel pending requests whose run has ended or was restarted.")

    def handle(self, *args: object, **options: object) -> None:
        if options["subcommand"] == "sweep":
            self.stdout.write(f"cancelled {services.cancel_orphans()} orphaned request(s)")
            return
        now = timezone.now()
        for request in approval_queue(status=str(options["status"])):
            if not request.is_pending:  # its expiry no longer means anything
                expiry = f"decided {timesince(request.decided_at, now)} ago" if request.decided_at else "closed"
            elif request.is_overdue(now):
                expiry = "overdue"
            else:
                expiry = f"expires in {timesince(now, request.expires_at)}"
            self.stdout.write(
                f"{request.pk}\t{request.status}\t{request.subject_type}:{request.subject_id} version {request.version}"
                f"\t{request.approvers}\tage {timesince(request.created_at, now)}\t{expiry}\t{request.summary}"
            )
