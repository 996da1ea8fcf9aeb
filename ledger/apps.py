from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ledger.selectors import run_section
        from workflows import hooks

        checks.register(check_timeouts)
        hooks.register_run_section(run_section)
        hooks.on_run_terminated(abandon_for_terminated_run)
        hooks.reserve_event_prefix("ledger:", why="the ledger sends them when an operation settles")


def abandon_for_terminated_run(run: Any) -> None:
    """``workflows.hooks.on_run_terminated``: inside run_terminate's transaction, the run row locked.
    The run's pending operations will never be sent: they are failed as abandoned at once."""
    from ledger.services import operations_abandon_for_run

    operations_abandon_for_run(run.id)


def check_timeouts(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A submit younger than its own timeouts may still be in flight: taking it for stale would let a
    lookup answer "not found" for a request still on its way, and the ledger send it a second time."""
    from ledger.conf import conf

    settings = conf()
    longest_call = settings["CONNECT_TIMEOUT"] + 2 * settings["READ_TIMEOUT"]  # connect, write, read
    if settings["STALE_SUBMITTED_SECONDS"] <= longest_call:
        return [
            checks.Error(
                f"LEDGER_STALE_SUBMITTED_SECONDS ({settings['STALE_SUBMITTED_SECONDS']:g}) must exceed "
                f"LEDGER_CONNECT_TIMEOUT + 2 * LEDGER_READ_TIMEOUT ({longest_call:g}), the longest a call may last",
                id="ledger.E001",
            )
        ]
    return []
