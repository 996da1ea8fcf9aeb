"""Writes of the schedules app: the tick that fires due schedules, "fire now", and keeping a
schedule's next due time right when it is created, edited, enabled or disabled.

Each due time fires once, however many ticks meet it (two beats, a beat restarted, a tick and a
"fire now"), for two reasons that hold apart:

- the tick takes each due schedule's row with ``SELECT … FOR UPDATE SKIP LOCKED``, reads its due
  time under that lock, and in the same transaction inserts the firing row (unique per schedule
  and due time), starts the work and moves ``next_due_at`` on. Another tick skips the locked row,
  or reads the moved due time once it is committed;
- the work is started with the idempotency key ``schedule:<name>:<due time ISO>``: a run or a
  submission of that key is found, not made again, even if a firing row were lost.

A due time missed (beat down for a night) fires once, for the latest due time missed; the ones
before it are skipped. A firing whose work is refused or breaks is recorded as failed with the
error and the schedule moves on to its next due time: it is not retried (an operator can "fire
now"). Firings' work goes through the lower apps' own services (``workflows.services.run_start``,
``agents.submissions.submission_create``), which send anything that leaves the database on commit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import Account
from agents.models import Agent
from agents.registry import get_agent_class
from agents.selectors import NAME_RULE, reachable_name
from agents.services import AgentUnavailable, agent_open
from agents.submissions import check_submission, submission_create
from ledger.services import PurgeResult, purge_in_batches, retention_cutoff
from schedules.models import Action, Outcome, Schedule, ScheduleFiring, Trigger
from schedules.spec import SpecError
from workflows.exceptions import InvalidPayload, UnknownWorkflow
from workflows.registry import get_workflow, internal_refusal
from workflows.services import run_start, validated_payload

logger = logging.getLogger("schedules")

# What a schedule's edit can change about when it is due: a change re-arms it from now.
SPEC_FIELDS = ("cron", "interval_seconds", "timezone")
MAX_PER_TICK = 1000


class ActionFailed(Exception):
    """The firing's work cannot be done (no such account, agent kind, workflow); the message says why."""


@dataclass
class TickReport:
    fired: list[ScheduleFiring] = field(default_factory=list)
    armed: int = 0  # schedules whose first due time was worked out (installed by a migration, say)
    disabled: list[str] = field(default_factory=list)  # schedules whose stored spec is invalid


def idempotency_key(schedule: Schedule, due_at: datetime) -> str:
    return f"schedule:{schedule.name}:{due_at.astimezone(UTC).isoformat()}"


# --- checks --------------------------------------------------------------------------------------
# What to look at when a name is not registered in this process but is in the system: the module
# that registers it is not loaded here (the examples only with INSTALL_EXAMPLES=1, a project's own
# through WORKFLOWS_MODULES or AGENTS_MODULES, as the running processes have them).
NOT_LOADED = (
    " in this process (is the module that registers it loaded: INSTALL_EXAMPLES, WORKFLOWS_MODULES, AGENTS_MODULES?)"
)


def action_problems(schedule: Schedule) -> list[tuple[str, str]]:
    """(field, problem) for an action that cannot be done as configured, in this process."""
    if schedule.action == Action.WORKFLOW:
        if not schedule.workflow:
            return [("workflow", "a workflow schedule names its workflow")]
        try:
            cls = get_workflow(schedule.workflow)
        except UnknownWorkflow:
            return [("workflow", f"no workflow is registered as {schedule.workflow!r}{NOT_LOADED}")]
        refused = internal_refusal(schedule.workflow, "a schedule")
        if refused:
            return [("workflow", refused)]
        if not isinstance(schedule.payload, dict):
            return [("payload", "the payload must be a JSON object")]
        try:  # what every firing's run_start would check: refused now rather than at each firing
            validated_payload(cls, schedule.payload)
        except InvalidPayload as exc:
            return [("payload", str(exc))]
        return []
    if schedule.action != Action.SUBMISSION:
        return [("action", f"the action is {Action.WORKFLOW} or {Action.SUBMISSION}")]
    problems = [(name, "required for a submission") for name in ("account", "agent_kind", "agent_name", "message")]
    problems = [(name, text) for name, text in problems if not getattr(schedule, name)]
    if schedule.payload:  # it would be kept and never used
        problems.append(("payload", "a submission sends its message: the payload is for a workflow; leave it empty"))
    if schedule.agent_kind and get_agent_class(schedule.agent_kind) is None:
        problems.append(("agent_kind", f"no agent kind {schedule.agent_kind!r} is registered{NOT_LOADED}"))
    if schedule.agent_name and not reachable_name(schedule.agent_name):
        problems.append(("agent_name", NAME_RULE))
    if schedule.account and not Account.objects.filter(slug=schedule.account).exists():
        problems.append(("account", f"no account {schedule.account!r}"))
    if schedule.message:
        try:  # the message as every firing's submission would check it
            check_submission([{"role": "user", "content": schedule.message}], {})
        except InvalidPayload as exc:
            problems.append(("message", str(exc).removeprefix("messages[0]: ")))
    return problems


# --- the tick -------------------------------------------------------------------------------------
def schedules_tick(*, now: datetime | None = None) -> TickReport:
    """Fire every enabled schedule due at ``now``, each in a transaction of its own (one broken
    schedule never holds up the others), and work out the first due time of those without one."""
    now = now or timezone.now()
    report = TickReport()
    seen: list[int] = []
    while len(seen) < MAX_PER_TICK:
        with transaction.atomic():
            schedule = (
                Schedule.objects.select_for_update(skip_locked=True)
                .filter(Q(next_due_at__lte=now) | Q(next_due_at__isnull=True), enabled=True)
                .exclude(pk__in=seen)
                .order_by(F("next_due_at").asc(nulls_first=True), "pk")
                .first()
            )
            if schedule is None:
                break
            seen.append(schedule.pk)
            _tick_one(schedule, now, report)
    return report


def _tick_one(schedule: Schedule, now: datetime, report: TickReport) -> None:
    """Call inside atomic(), the schedule's row locked."""
    try:
        spec = schedule.spec()
        if schedule.next_due_at is None:
            schedule.next_due_at = spec.next_after(now)
            schedule.save(update_fields=["next_due_at", "updated_at"])
            report.armed += 1
            return
        due_at = spec.latest_due(schedule.next_due_at, now)  # the latest due time missed, if several
    except SpecError as exc:
        _disable(schedule, exc, report)
        return
    if due_at > schedule.next_due_at:
        # The tick did not run at the due times before (beat or the workers were down): they are
        # not made up, only the latest fires. Said, so that nobody wonders where they went.
        logger.warning(
            "schedule %s: due times from %s to before %s were missed; the latest, %s, fires",
            schedule.name,
            schedule.next_due_at.isoformat(),
            due_at.isoformat(),
            due_at.isoformat(),
            extra={"event": "schedule.missed", "schedule": schedule.name},
        )
    firing = fire_locked(schedule, due_at=due_at, trigger=Trigger.SCHEDULE, now=now)
    if firing is not None:
        report.fired.append(firing)
    schedule.last_fired_at = now
    try:
        schedule.next_due_at = spec.next_after(due_at)
    except SpecError as exc:  # fired for due_at first: the due time it had is never lost
        schedule.save(update_fields=["last_fired_at", "updated_at"])
        _disable(schedule, exc, report)
        return
    schedule.save(update_fields=["next_due_at", "last_fired_at", "updated_at"])


def _disable(schedule: Schedule, exc: SpecError, report: TickReport) -> None:
    """Only a row written around the checks (SQL, a bad migration) gets here: said, and stopped,
    rather than tried again at every tick."""
    logger.error("schedule %s disabled: %s", schedule.name, exc)
    schedule.enabled = False
    schedule.save(update_fields=["enabled", "updated_at"])
    report.disabled.append(schedule.name)


def fire_locked(schedule: Schedule, *, due_at: datetime, trigger: str, now: datetime) -> ScheduleFiring | None:
    """Fire ``schedule`` for ``due_at``: the firing row and the work, or None if that due time has
    fired already. Call inside atomic() with the schedule's row locked. The work runs in a savepoint:
    refused or broken, it leaves nothing of itself and the firing is recorded as failed."""
    key = idempotency_key(schedule, due_at)
    try:
        with transaction.atomic():
            firing = ScheduleFiring.objects.create(
                schedule=schedule,
                due_at=due_at,
                fired_at=now,
                trigger=trigger,
                outcome=Outcome.STARTED,
                idempotency_key=key,
            )
    except IntegrityError:
        return None  # (schedule, due_at) is unique: this due time fired before
    try:
        with transaction.atomic():
            created = _perform(schedule, firing, due_at)
    except Exception as exc:  # one schedule's bug or refusal must not stop the tick or the others
        firing.outcome = Outcome.FAILED
        firing.error = f"{type(exc).__name__}: {exc}"[:10_000]
        logger.warning("schedule %s firing for %s failed: %s", schedule.name, due_at.isoformat(), firing.error)
    else:
        firing.outcome = Outcome.STARTED if created else Outcome.EXISTED
    firing.save(update_fields=["outcome", "error", "run", "submission"])
    return firing


def _perform(schedule: Schedule, firing: ScheduleFiring, due_at: datetime) -> bool:
    """Start the schedule's work under the firing's key; whether it was created (not found)."""
    if schedule.action == Action.WORKFLOW:
        # Checked again here, not only when saved: a schedule written before the workflow became
        # internal, or by code rather than the admin or the command, must not start it either.
        refused = internal_refusal(schedule.workflow, "a schedule")
        if refused:
            raise ActionFailed(refused)
        run, created = run_start(
            workflow=schedule.workflow, payload=schedule.payload, idempotency_key=firing.idempotency_key
        )
        firing.run = run
        return created
    if schedule.action != Action.SUBMISSION:
        raise ActionFailed(f"unknown action {schedule.action!r}")
    result = submission_create(
        agent=_agent_of(schedule),
        user=None,
        messages=[{"role": "user", "content": schedule.message}],
        metadata={"schedule": schedule.name, "due_at": due_at.isoformat()},
        idempotency_key=firing.idempotency_key,
        caller=f"schedule:{schedule.name}",
    )
    firing.submission = result.submission
    return result.accepted


def _agent_of(schedule: Schedule) -> Agent:
    """The agent a submission schedule names, created on first use, without a user: the schedule
    itself is the trusted caller (as ``manage.py agents submit`` and a webhook source are)."""
    try:
        return agent_open(account=schedule.account, kind=schedule.agent_kind, name=schedule.agent_name)
    except AgentUnavailable as exc:
        raise ActionFailed(str(exc)) from None


# --- by hand --------------------------------------------------------------------------------------
def schedule_fire(*, schedule: Schedule, now: datetime | None = None) -> ScheduleFiring | None:
    """Fire now, enabled or not ("fire now"): a firing whose due time is ``now`` to the second,
    idempotent on that second (None if a firing has it already: a double click, two people at
    once). The next due time stays as it was."""
    now = (now or timezone.now()).replace(microsecond=0)
    with transaction.atomic():
        locked = Schedule.objects.select_for_update().get(pk=schedule.pk)
        firing = fire_locked(locked, due_at=now, trigger=Trigger.MANUAL, now=now)
        if firing is not None:
            locked.last_fired_at = now
            locked.save(update_fields=["last_fired_at", "updated_at"])
    return firing


def schedules_enable(*, schedules: Iterable[Schedule], enabled: bool, now: datetime | None = None) -> int:
    """Enable or disable; how many changed. An enabled schedule is due next after ``now``: what it
    missed while disabled never fires."""
    now = now or timezone.now()
    changed = 0
    with transaction.atomic():
        for schedule in Schedule.objects.select_for_update().filter(pk__in=[s.pk for s in schedules]).order_by("pk"):
            if schedule.enabled == enabled:
                continue
            schedule.enabled = enabled
            schedule.next_due_at = schedule.spec().next_after(now) if enabled else None
            schedule.save(update_fields=["enabled", "next_due_at", "updated_at"])
            changed += 1
    return changed


class ScheduleChanged(Exception):
    """An edit made on a schedule as it was (``seen``) that has changed since."""


# What people set (the admin, the command); the rest is the tick's, or Django's.
SETTING_FIELDS = tuple(
    f.name
    for f in Schedule._meta.concrete_fields
    if f.name not in ("id", "next_due_at", "last_fired_at", "created_at", "updated_at")
)


def schedule_settings(schedule: Schedule) -> dict[str, Any]:
    """What people set of ``schedule``, as JSON: an edit form carries it from when it was loaded."""
    return cast(dict[str, Any], json.loads(json.dumps({name: getattr(schedule, name) for name in SETTING_FIELDS})))


def schedule_lock_as_seen(*, pk: int, seen: dict[str, Any] | None) -> None:
    """Inside atomic(): lock the schedule's row until the transaction ends. ScheduleChanged if an
    edit began from ``seen`` (``schedule_settings`` then) and the row is gone or its settings changed."""
    current = Schedule.objects.select_for_update().filter(pk=pk).first()
    if seen is not None and (current is None or schedule_settings(current) != seen):
        raise ScheduleChanged("deleted since the edit began" if current is None else "changed since the edit began")


def schedule_save(
    *,
    schedule: Schedule,
    changed: Iterable[str] = (),
    seen: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Save a schedule that passed ``full_clean()`` (the admin's form, ``manage.py schedules add``).
    A new one, or one whose timing changed or that was just enabled, is due next after ``now``;
    otherwise the tick's ``next_due_at`` and ``last_fired_at`` are left as the tick wrote them (a
    form loaded before a tick must not move them back).

    ``seen``, ``schedule_settings`` of the schedule as the edit began: ScheduleChanged if someone
    changed it since (a page opened before another operator disabled a misbehaving schedule would
    otherwise enable it again with its save, whatever field it was opened to change)."""
    now = now or timezone.now()
    changed = set(changed)
    with transaction.atomic():
        if schedule.pk is None:
            schedule.next_due_at = schedule.spec().next_after(now) if schedule.enabled else None
            schedule.save()
            return schedule
        schedule_lock_as_seen(pk=schedule.pk, seen=seen)
        fields = [*SETTING_FIELDS, "updated_at"]  # the tick's times as the tick wrote them
        if changed & {*SPEC_FIELDS, "enabled"}:
            schedule.next_due_at = schedule.spec().next_after(now) if schedule.enabled else None
            fields.append("next_due_at")
        schedule.save(update_fields=fields)
    return schedule


def schedule_ensure(*, name: str, defaults: dict[str, object], now: datetime | None = None) -> tuple[Schedule, bool]:
    """The schedule ``name``, created with ``defaults`` (checked) if missing; an existing one is left
    as it is (an operator may have changed or disabled it). Safe to repeat (``seed_demo``)."""
    existing = Schedule.objects.filter(name=name).first()
    if existing is not None:
        return existing, False
    schedule = Schedule(name=name, **defaults)
    schedule.full_clean()
    try:
        return schedule_save(schedule=schedule, now=now), True
    except IntegrityError:  # created meanwhile
        return Schedule.objects.get(name=name), False


def firing_purge(
    *, older_than: timedelta | None = None, dry_run: bool = False, now: datetime | None = None
) -> PurgeResult:
    """Delete the firing records due before now - ``older_than`` (default SCHEDULES_RETENTION_DAYS),
    in batches of short transactions, as the other purges do. The runs and submissions they started
    stay. Safe for the once-per-due-time promise: a schedule fires only at or after its stored next
    due time, which never goes back, so an old due time whose record is gone is never fired again
    (and its work's idempotency key, from the due time, would find the work it started)."""
    cutoff = retention_cutoff(older_than, default_days=settings.SCHEDULES_RETENTION_DAYS, now=now)
    result = purge_in_batches(ScheduleFiring.objects.filter(due_at__lt=cutoff), cutoff=cutoff, dry_run=dry_run)
    if not dry_run:
        logger.info("purged %d schedule firings due before %s", result.count, cutoff.isoformat())
    return result
