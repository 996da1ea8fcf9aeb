"""A run that waits for an operation's outcome is woken the moment anyone else settles it.

The run that performed an operation whose outcome is unknown checks it again later (its next
``perform`` looks it up). Between checks it waits with ``wait_for_outcome(step, name, key=,
timeout=)``: an engine wait for the event ``ledger:settled:<key>``, with the check interval as
its timeout. Whenever the operation becomes succeeded or failed by another hand (``reconcile``, a
provider's webhook through ``operation_report``, a person in the admin), ``wake_waiting_run``
sends that event to its run, inside the transaction that settles it: the run resumes at once and
its check reads the outcome from storage. So does a lookup that finds the provider never received
it (pending again: the run's check sends it again now, not at the end of its wait). The event
carries nothing: the ledger row is the authority, the event is only the knock on the door. An event
sent before the run waits is kept and consumed by its next wait; one sent to a run that ended is
dropped.

The prefix ``ledger:`` is reserved (``LedgerConfig.ready``): nobody else can send these events.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import TYPE_CHECKING

from workflows.context import current_step
from workflows.exceptions import TransitionNotAllowed, WaitTimeout
from workflows.services import run_send_event

if TYPE_CHECKING:
    from ledger.models import ExternalOperation
    from workflows.engine import Step

PREFIX = "ledger:"
SETTLED = f"{PREFIX}settled:"
TYPE_MAX = 200  # workflows.services.run_send_event's limit for an event type


def outcome_event_type(key: str) -> str:
    """The event type that wakes the run waiting for ``key``'s outcome (a long key is hashed)."""
    event_type = f"{SETTLED}{key}"
    if len(event_type) <= TYPE_MAX:
        return event_type
    return f"{SETTLED}sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def wait_for_outcome(step: Step, name: str, *, key: str, timeout: timedelta | float) -> bool:
    """Wait until the operation ``key`` is settled by someone else, at most ``timeout``. True if it
    was (the next perform or lookup answers from storage), False when the time ran out."""
    try:
        step.wait_for_event(name, type=outcome_event_type(key), timeout=timeout)
    except WaitTimeout:
        return False
    return True


def wake_waiting_run(op: ExternalOperation, *, reopened: bool = False) -> None:
    """Send the operation's run the event that wakes its ``wait_for_outcome``. Call inside the
    transaction that settled ``op`` (or, ``reopened``, found it never received: pending again, for
    its run to send it again), its row locked (the run row is locked after it). Nothing when the run
    itself did (it is in the step that reads the answer), or the run has ended."""
    if op.run_id is None:
        return
    context = current_step()
    if context is not None and context.run_id == op.run_id:
        return
    event_type = outcome_event_type(op.key)
    # Once per operation: settled again (a contradiction found later) is the same knock. A reopening
    # is a knock of its own for each send it follows, so that the send after it, unknown in its
    # turn, is still knocked for when it is settled or reopened.
    key = f"{event_type}#reopened-{op.submit_count}" if reopened else event_type
    try:
        run_send_event(run_id=op.run_id, type=event_type, idempotency_key=key, system=True)
    except TransitionNotAllowed:
        pass  # the run has ended: nobody waits
