"""``manage.py agents list``: the registered agent kinds, their model and tools."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser

from agents.registry import agent_kinds, get_agent_class


class Command(BaseCommand):
    help = "Agents: `agents list` shows the registered kinds."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        sub.add_parser("list", help="The registered agent kinds, with their model and tools.")

    def handle(self, *args: object, **options: object) -> None:
        for kind in agent_kinds():
            cls = get_agent_class(kind)
            assert cls is not None
            tools = ", ".join(t.name for t in cls.tools) or "-"
            self.stdout.write(f"{kind}\t{cls.__module__}.{cls.__qualname__}\tmodel {cls.model}\ttools {tools}")
