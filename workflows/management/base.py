"""What the project's management commands share: a parser that refuses what argparse would misread,
and JSON options read as the API reads JSON."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.storable import json_loads_strict

# ``--name=--``: Python 3.11's argparse takes the "--" for the end of the options and gives the
# option an empty list, which the command would then take for a value.
EMPTIED = re.compile(r"(--[^=\s]+)=--")
# ``--older-than -5d``: argparse takes "-5d" for an option (only "-5" looks like a number to it) and
# says "expected one argument". Joined to its option (``--older-than=-5d``), the command's own check
# says what is wrong with it.
NEGATIVE = re.compile(r"-\d[\w.:]*")


class ProjectCommand(BaseCommand):
    """A command whose parser refuses ``--option=--`` (CommandError, or the usage and exit status 2
    from a shell) instead of reading it as an empty list: a traceback, or an option quietly
    ignored (``--owner=--`` started a run with no owner); and reads ``--option -5d`` as
    ``--option=-5d``, for the option's own check to refuse with its reason."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parse_args = parser.parse_args

        def checked(args: Sequence[str] | None = None, namespace: Any = None) -> Any:
            given: list[str] = []
            for arg in args or ():
                if isinstance(arg, str) and (emptied := EMPTIED.fullmatch(arg)):
                    parser.error(f"{emptied[1]} cannot take '--' as its value (it is read as none)")
                previous = given[-1] if given else ""
                if NEGATIVE.fullmatch(arg) and previous.startswith("--") and len(previous) > 2 and "=" not in previous:
                    given[-1] = f"{previous}={arg}"
                else:
                    given.append(arg)
            return parse_args(given if args is not None else None, namespace)

        parser.parse_args = checked  # type: ignore[method-assign,assignment]
        return parser


def json_option(text: str, option: str) -> Any:
    """The JSON an option holds, read as the API reads a body (no NaN or Infinity), or CommandError
    saying what is wrong with it (a value too deeply nested to read included)."""
    try:
        return json_loads_strict(text)
    except RecursionError:
        raise CommandError(f"{option} is not valid JSON: it is nested too deeply to read") from None
    except ValueError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc}") from None
