"""Explicit extension points for the apps above the ledger (the way ``workflows.hooks`` serves the
engine's): the ledger may not import them, so an app that must act when an operation's outcome
becomes known registers a function here from its ``AppConfig.ready``.

``on_operation_settled(hook)`` registers; the ledger's services call ``fire_operation_settled(op)``,
which calls ``hook(op)``, when an operation becomes succeeded or failed, whoever settled it (a
submit's answer, a lookup by ``perform`` or ``reconcile``, a person in the admin), inside the
transaction that records it, with the operation's row locked. Hooks only write to the database.
The usual reader of an outcome is the run that performed the operation; a hook is for what must
happen when that run has ended and will never read it (a refund whose run was terminated while its
outcome was unknown, then reconciled as paid).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledger.models import ExternalOperation

SettledHook = Callable[["ExternalOperation"], None]
_on_settled: list[SettledHook] = []


def on_operation_settled(hook: SettledHook) -> SettledHook:
    """Register ``hook(op)`` (usable as a decorator); see the module's docstring."""
    if hook not in _on_settled:
        _on_settled.append(hook)
    return hook


def fire_operation_settled(op: ExternalOperation) -> None:
    """Wake the run waiting for ``op``'s outcome (``ledger.waits``), then call the hooks for ``op``,
    which is now succeeded or failed (call inside atomic(), row locked)."""
    from ledger.waits import wake_waiting_run  # the engine's services, imported once apps are ready

    wake_waiting_run(op)
    for hook in _on_settled:
        hook(op)


def fire_operation_reopened(op: ExternalOperation) -> None:
    """Wake the run waiting for ``op``'s outcome: a lookup found the provider never received it, so
    it is pending again, for that run to send it again (call inside atomic(), row locked). No hooks:
    nothing is settled."""
    from ledger.waits import wake_waiting_run

    wake_waiting_run(op, reopened=True)
