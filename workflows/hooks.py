"""Explicit extension points for the apps above the engine.

The engine may not import them (apps import only from layers below), so an app that must act
when a run changes registers a function here from its ``AppConfig.ready`` (``on_run_terminated``,
``on_run_restarted``, ``on_run_failed``); the engine and its services fire them (``fire_run_terminated``,
...). They are called inside a transaction, with the run row locked, and must only write to the
database (anything that leaves it goes through ``workflows.outbox.on_commit``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from workflows.models import WorkflowRun

RunHook = Callable[[WorkflowRun], None]


class RunSection(TypedDict):
    """Something an app wants shown with a run (its page and its admin page): a titled table."""

    title: str
    note: str
    columns: list[str]
    rows: list[list[str]]


RunSectionProvider = Callable[[WorkflowRun], "RunSection | None"]
_run_sections: list[RunSectionProvider] = []


def register_run_section(provider: RunSectionProvider) -> RunSectionProvider:
    """Register ``provider(run)``, returning a section to show with the run or None."""
    if provider not in _run_sections:
        _run_sections.append(provider)
    return provider


def run_sections(run: WorkflowRun) -> list[RunSection]:
    return [section for provider in _run_sections if (section := provider(run)) is not None]


_reserved_events: dict[str, str] = {}


def reserve_event_prefix(prefix: str, *, why: str) -> None:
    """Event types and event idempotency keys starting with ``prefix`` belong to one app: only its
    own services send them (``run_send_event(..., system=True)``). Anyone else, through the API,
    ``send_event`` or ``manage.py workflows send-event``, is refused with ``why``: a customer who
    owns a run must not be able to post the event an approval would send."""
    if not prefix:
        raise ValueError("a reserved event prefix may not be empty")
    _reserved_events[prefix] = why


def reserved_event(value: str | None) -> str | None:
    """Why ``value`` (an event type or key) is reserved, or None when anyone may use it."""
    if value:
        for prefix, why in _reserved_events.items():
            if value.startswith(prefix):
                return f"event types and keys starting with {prefix!r} are reserved: {why}"
    return None


_on_terminated: list[RunHook] = []
_on_restarted: list[RunHook] = []
_on_failed: list[RunHook] = []


def on_run_terminated(hook: RunHook) -> RunHook:
    """Register ``hook(run)`` to be called when a run is terminated (usable as a decorator)."""
    if hook not in _on_terminated:
        _on_terminated.append(hook)
    return hook


def on_run_restarted(hook: RunHook) -> RunHook:
    """Register ``hook(run)`` to be called when a run starts a new attempt (``run.attempt`` is the
    new one; whatever the earlier attempt left waiting is now orphaned)."""
    if hook not in _on_restarted:
        _on_restarted.append(hook)
    return hook


def on_run_failed(hook: RunHook) -> RunHook:
    """Register ``hook(run)`` to be called when the engine has failed a run, for any reason: a step
    that failed for good and was not caught, ``non_determinism``, or before the workflow's code ran
    at all (``max_recovery_attempts``, ``unknown_workflow``), where the workflow could not clean up
    after itself. Called right after the failure is stored, in a transaction of its own with the
    run row locked and the run still failed; a worker that dies in between leaves it uncalled."""
    if hook not in _on_failed:
        _on_failed.append(hook)
    return hook


def fire_run_terminated(run: WorkflowRun) -> None:
    """Call the hooks registered with ``on_run_terminated`` (inside atomic(), the run row locked)."""
    for hook in _on_terminated:
        hook(run)


def fire_run_restarted(run: WorkflowRun) -> None:
    """Call the hooks registered with ``on_run_restarted`` (inside atomic(), the run row locked)."""
    for hook in _on_restarted:
        hook(run)


def fire_run_failed(run: WorkflowRun) -> None:
    """Call the hooks registered with ``on_run_failed`` (inside atomic(), the run row locked)."""
    for hook in _on_failed:
        hook(run)
