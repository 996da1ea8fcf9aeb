"""``manage.py agents list``: the registered agent kinds, their model and tools.
``manage.py agents fibers``: the newest fibers (an agent's background jobs) and where they stand."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agents.models import Fiber, FiberStatus
from agents.registry import agent_kinds, get_agent_class


class Command(BaseCommand):
    help = "Agents: `agents list` shows the registered kinds; `agents fibers` the newest fibers."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        sub.add_parser("list", help="The registered agent kinds, with their model and tools.")
        fibers = sub.add_parser("fibers", help="The newest fibers: agent, name, status, attempts, stash version.")
        fibers.add_argument("--status", choices=FiberStatus.values, help="Only fibers in this status.")
        fibers.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["subcommand"] == "fibers":
            self.fibers(status=options.get("status"), limit=int(options.get("limit") or 50))
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
        for f in rows[: max(limit, 0)]:
            self.stdout.write(
                f"{f.pk}\t{f.agent.account.slug}/{f.agent.kind}/{f.agent.name}\t{f.name}\t{f.status}"
                f"\tattempts {f.attempts}\tstash v{f.stash_version}\t{f.end_reason or '-'}"
            )
