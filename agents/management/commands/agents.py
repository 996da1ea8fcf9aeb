"""``manage.py agents list``: the registered agent kinds, their model and tools.
``manage.py agents fibers``: the newest fibers (an agent's background jobs) and where they stand.
``manage.py agents purge-chunks [--older-than 30d] [--dry-run]``: the retention of turns' streams.
``manage.py agents submit --account A --kind K --name N --text T [--key K] [--metadata JSON]``: a
submission, as ``POST .../submissions`` makes one (``agents.submissions``).
``manage.py agents queue-submissions``: queue now the turns of submissions still in an agent's
inbox (beat's sweep does it for those waiting longer than AGENTS_SUBMISSION_QUEUE_GRACE_SECONDS)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from agents.models import Fiber, FiberStatus
from agents.registry import agent_kinds, get_agent_class
from agents.services import TooManyQueuedTurns, chunks_purge
from ledger.durations import add_retention_arguments, purge_report
from workflows.apis.common import IDEMPOTENCY_KEY_MAX, idempotency_key_valid
from workflows.management.base import ProjectCommand, json_option


class Command(ProjectCommand):
    help = (
        "Agents: `agents list` shows the registered kinds; `agents fibers` the newest fibers; "
        "`agents purge-chunks` deletes the streams of turns that ended long ago."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        sub.add_parser("list", help="The registered agent kinds, with their model and tools.")
        fibers = sub.add_parser("fibers", help="The newest fibers: agent, name, status, attempts, stash version.")
        fibers.add_argument("--status", choices=FiberStatus.values, help="Only fibers in this status.")
        fibers.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")
        purge = sub.add_parser(
            "purge-chunks",
            help="Delete the stored streams of turns that ended before the cutoff; their answers stay.",
        )
        days = settings.AGENTS_CHUNK_RETENTION_DAYS
        add_retention_arguments(
            purge, which="the streams of turns ended", setting="AGENTS_CHUNK_RETENTION_DAYS", days=days
        )
        submit = sub.add_parser("submit", help="Hand an agent a message, as another system would (a submission).")
        submit.add_argument("--account", required=True, help="The account's slug.")
        submit.add_argument("--kind", required=True, help="The agent's kind.")
        submit.add_argument("--name", required=True, help="The agent's name (created on first use).")
        submit.add_argument("--text", required=True, action="append", help="A message (repeat for several).")
        submit.add_argument("--key", help="An idempotency key: the same key and text again is a no-op.")
        submit.add_argument("--metadata", default="{}", help="A JSON object kept with the submission.")
        sub.add_parser(
            "queue-submissions",
            help="Queue now the turns of submissions accepted over HTTP and still waiting for a worker to queue them.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["subcommand"] == "fibers":
            self.fibers(status=options.get("status"), limit=int(options.get("limit") or 50))
            return
        if options["subcommand"] == "purge-chunks":
            self.purge(older_than=options["older_than"], dry_run=options["dry_run"])
            return
        if options["subcommand"] == "submit":
            self.submit(options)
            return
        if options["subcommand"] == "queue-submissions":
            from agents.submissions import submissions_sweep

            self.stdout.write(f"Queued the inbox of {submissions_sweep(grace_seconds=0)} agent(s).")
            return
        for kind in agent_kinds():
            cls = get_agent_class(kind)
            assert cls is not None
            tools = ", ".join(t.name for t in cls.tools) or "-"
            self.stdout.write(f"{kind}\t{cls.__module__}.{cls.__qualname__}\tmodel {cls.model}\ttools {tools}")

    def fibers(self, *, status: str | None, limit: int) -> None:
        rows = Fiber.objects.select_related("agent__account").order_by("-created_at")
        if status:
            rows = rows.filter(status=status)
        shown = list(rows[: max(limit, 0)])
        if not shown:
            self.stdout.write(f"No {status} fibers." if status else "No fibers.")
        for f in shown:
            self.stdout.write(
                f"{f.pk}\t{f.agent.account.slug}/{f.agent.kind}/{f.agent.name}\t{f.name}\t{f.status}"
                f"\tattempts {f.attempts}\tstash v{f.stash_version}\t{f.end_reason or '-'}"
            )

    def purge(self, *, older_than: Any, dry_run: bool) -> None:
        try:
            result = chunks_purge(older_than=older_than, dry_run=dry_run)
        except ValueError as exc:  # zero or less, or reaching before the year 1
            raise CommandError(f"--older-than: {exc}") from None
        for line in purge_report(
            deleted=f"{result.chunks} chunk(s) of {result.turns} turn(s) ended",
            cutoff=result.cutoff,
            dry_run=result.dry_run,
            older_than=older_than,
            default_days=settings.AGENTS_CHUNK_RETENTION_DAYS,
        ):
            self.stdout.write(line)

    def submit(self, options: dict[str, Any]) -> None:
        from agents.services import AgentUnavailable, agent_open
        from agents.submissions import check_submission, submission_create
        from workflows.exceptions import WorkflowError

        metadata = json_option(options["metadata"], "--metadata")
        messages = [{"role": "user", "content": text} for text in options["text"]]
        key = options["key"]  # None without --key; an empty one (an unset shell variable) is refused
        if key is not None and not idempotency_key_valid(key):
            raise CommandError(
                f"--key must be 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters, no space at either end"
            )
        try:
            # Everything checked before the agent is opened: opening one creates it.
            check_submission(messages, metadata)
            agent = agent_open(account=options["account"], kind=options["kind"], name=options["name"])
            result = submission_create(
                agent=agent, user=None, messages=messages, metadata=metadata, idempotency_key=key, caller="command"
            )
        except AgentUnavailable as exc:
            raise CommandError(str(exc)) from None
        except (WorkflowError, TooManyQueuedTurns) as exc:
            raise CommandError(str(exc)) from None
        verb = "Submitted" if result.accepted else "Already submitted (same key and text)"
        self.stdout.write(f"{verb}: {result.submission.pk} {result.submission.status}")
