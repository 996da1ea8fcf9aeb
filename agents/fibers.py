"""Fibers: an agent's durable background jobs (``ChatAgent.run_fiber``), which checkpoint as they go.

    def index_documents(ctx: FiberContext) -> dict[str, int]:  # module level: a worker imports it
        done = (ctx.stashed or {}).get("done", 0)  # set after a crash: skip what is done
        for i, doc in enumerate(ctx.input["documents"][done:], start=done):
            index(doc)
            ctx.stash({"done": i + 1})  # stored at once: a crash after it keeps it
        return {"indexed": len(ctx.input["documents"])}

    SupportAgent(row).run_fiber("index", index_documents, "index-june", input={"documents": [...]})

A fiber is a run of the private ``agents.fiber`` workflow (payload ``{"fiber": "<uuid>"}``), so the
engine's leases, recovery and sweeper drive it; there is no other executor. Its steps:

- ``begin`` (atomic): ``pending`` -> ``running``.
- ``body``: the function, called in a worker with a ``FiberContext``. It is not retried when it
  raises (the fiber fails with the error, as a Cloudflare fiber does); it runs again only when its
  worker died mid-body (the run's lease expired and another worker took the run over; the engine's
  ``WORKFLOWS_MAX_RECOVERY_ATTEMPTS`` bounds how often). A body that runs again calls the agent's
  ``on_fiber_recovered(ctx)`` first, with ``ctx.recovered`` and the last stash in ``ctx.stashed``;
  it answers ``"continue"`` (the default: the function runs again and uses ``ctx.stashed`` to skip
  done work), ``"restart"`` (the stash is cleared and the function starts over) or ``"cancel"``
  (the fiber ends cancelled). A function that had returned but whose result was not stored yet when
  its worker died runs again as well: what it did must be skippable from its stash.
- ``finish`` or ``fail`` (atomic): the result, or the error.

``ctx.stash(data)`` replaces the checkpoint (a JSON value) at once, in its own transaction fenced by
the run's lease like a turn's chunks (``agents.chunks.fence``): a worker that lost the run (taken
over, cancelled) stores nothing, and its function gets ``FencedOut`` there, which ends it.

``agents.services.fiber_cancel`` terminates the fiber's run; ``on_run_terminated`` here (a hook of
the engine) ends the fiber cancelled whoever terminated its run (the admin too). A run that ended
failed by the engine (too many lost workers) fails its fiber at once through ``on_run_failed``
(another hook); ``repair_locked`` does the same when the agent next starts a fiber, should a worker
die between the two.

Each change of a fiber's status is pushed to the agent's clients as ``agent.fiber``
(``agents.streams``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from agents import streams
from agents.chunks import FencedOut, dumps, fence
from agents.models import FIBER_OPEN, Agent, Fiber, FiberStatus
from agents.registry import FIBER_RECOVERY_CHOICES, agent_of
from workflows import Retries, StepError, Workflow, current_step, workflow
from workflows.conf import conf
from workflows.exceptions import IdempotencyConflict, InvalidPayload, TransitionNotAllowed
from workflows.models import RunStatus
from workflows.services import check_json_size

if TYPE_CHECKING:
    from workflows.engine import Step
    from workflows.models import WorkflowRun
    from workflows.registry import Event

logger = logging.getLogger(__name__)

FIBER_WORKFLOW = "agents.fiber"
NO_RETRIES = Retries(limit=0)  # a function that raises fails its fiber; only a lost worker runs it again
PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class InvalidFiber(InvalidPayload):
    """The fiber cannot be started: its function is not importable by name (a lambda, a closure, a
    method, a function of ``__main__``), or its name, input or key is not acceptable (a 400)."""


class FiberConflict(IdempotencyConflict):
    """The idempotency key was used for another fiber of the agent (another name, function or input):
    a 409."""


class FiberNotCancellable(TransitionNotAllowed):
    """The fiber has ended already: a 409."""


# --- the function, by name ----------------------------------------------------------------------------
def fiber_path(fn: Callable[..., Any] | str) -> str:
    """``module:name`` of a module-level function (or that path, checked), so that any worker can
    import it; InvalidFiber for anything else."""
    if isinstance(fn, str):
        if not PATH.match(fn):
            raise InvalidFiber(f"a fiber's function is named module:function, not {fn!r}")
        resolve(fn)
        return fn
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", "") or ""
    if not inspect.isfunction(fn):
        raise InvalidFiber(f"a fiber's function must be a module-level function, not {fn!r}")
    if "<" in qualname or "." in qualname:
        what = "a lambda" if fn.__name__ == "<lambda>" else "a closure or a method"
        raise InvalidFiber(
            f"a fiber's function must be defined at module level so that a worker can import it; "
            f"{module}.{qualname} is {what}"
        )
    if module == "__main__":
        raise InvalidFiber(f"{qualname} is defined in __main__, which a worker cannot import")
    path = f"{module}:{qualname}"
    if resolve(path) is not fn:
        raise InvalidFiber(f"{path} names another object than the function given (is it decorated or shadowed?)")
    return path


def resolve(path: str) -> Callable[..., Any]:
    """The function ``module:name`` names, or InvalidFiber."""
    module_name, _, name = path.partition(":")
    try:
        value = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidFiber(f"the fiber's function {path} cannot be imported: {exc}") from None
    if not callable(value):
        raise InvalidFiber(f"{path} is not a function")
    fn: Callable[..., Any] = value
    return fn


# --- what the function gets ------------------------------------------------------------------------------
class FiberContext:
    """What a fiber's function (and ``on_fiber_recovered``) receives.

    ``agent``: the agent's row; ``fiber_id``, ``name``, ``input``; ``stashed``: the last stash (None
    if none, or after a restart); ``attempt``: 1 for the first run of the function, 2, … after each
    lost worker; ``recovered``: ``attempt > 1``. ``stash(data)`` replaces the checkpoint, durably, now.
    """

    def __init__(
        self,
        *,
        fiber: Fiber,
        run_id: UUID,
        owner: str,
    ) -> None:
        self.agent: Agent = fiber.agent
        self.fiber_id: UUID = fiber.pk
        self.name: str = fiber.name
        self.input: dict[str, Any] = fiber.input
        self.attempt: int = int(fiber.attempts)
        self.recovered: bool = self.attempt > 1
        self.stash_version: int = int(fiber.stash_version)
        self._stashed: Any = fiber.stash
        self._run_id = run_id
        self._owner = owner

    @property
    def stashed(self) -> Any:
        return self._stashed

    def stash(self, data: Any) -> int:
        """Replace the fiber's checkpoint with ``data`` (JSON) in a transaction of its own, fenced by
        the run's lease: stored when this returns (its new version), or FencedOut if this worker no
        longer holds the run (the fiber was cancelled, or another worker took it over)."""
        check_json_size(data, what="a fiber's stash")
        value = json.loads(dumps(data))
        self.stash_version = _write_stash(self.fiber_id, value, self._run_id, self._owner)
        self._stashed = value
        return self.stash_version

    def clear(self) -> int:
        """Drop the checkpoint (``stashed`` becomes None), fenced like ``stash``."""
        self.stash_version = _write_stash(self.fiber_id, None, self._run_id, self._owner)
        self._stashed = None
        return self.stash_version

    def __repr__(self) -> str:
        return f"<FiberContext {self.name} {self.fiber_id} attempt {self.attempt}>"


def _write_stash(fiber_id: UUID, value: Any, run_id: UUID, owner: str) -> int:
    with transaction.atomic():
        fence(run_id, owner)  # share-locks the run's row until this commit: no terminate in between
        fiber = Fiber.objects.select_for_update().get(pk=fiber_id)
        if fiber.status != FiberStatus.RUNNING:
            raise FencedOut(f"fiber {fiber_id} is {fiber.status}; its stash is not written")
        fiber.stash = value
        fiber.stash_version += 1
        fiber.save(update_fields=["stash", "stash_version", "updated_at"])
        return int(fiber.stash_version)


# --- pushes --------------------------------------------------------------------------------------------
def fiber_data(fiber: Fiber) -> dict[str, Any]:
    """What the agent's clients are told of a fiber (its result and stash stay in the database; a
    failure's own text, an exception's, is for staff, who read it in the admin)."""
    return {
        "id": str(fiber.pk),
        "name": fiber.name,
        "status": fiber.status,
        "stash_version": fiber.stash_version,
        "attempts": fiber.attempts,
        "end_reason": "it failed" if fiber.status == FiberStatus.FAILED else fiber.end_reason,
    }


def push_fiber(fiber: Fiber) -> None:
    streams.push_later(fiber.agent_id, {"type": "agent.fiber", "fiber": fiber_data(fiber)})


def end_locked(fiber: Fiber, *, status: str, reason: str, result: Any = None, error: Any = None) -> None:
    """End an open fiber (inside atomic(), its row locked): the transition, why, push."""
    transition = {
        FiberStatus.COMPLETED: fiber.complete,
        FiberStatus.FAILED: fiber.fail,
        FiberStatus.CANCELLED: fiber.cancel,
    }[FiberStatus(status)]
    transition()
    fiber.end_reason = reason[:500]
    fiber.result = result
    fiber.error = error
    fiber.finished_at = timezone.now()
    fiber.save(update_fields=["status", "end_reason", "result", "error", "finished_at", "updated_at"])
    push_fiber(fiber)


def on_run_terminated(run: WorkflowRun) -> None:
    """The hook (``workflows.hooks.on_run_terminated``): a fiber whose run was terminated (a cancel,
    staff in the admin) is cancelled."""
    fiber = Fiber.objects.select_for_update().filter(run=run).first()
    if fiber is not None and fiber.status in FIBER_OPEN:
        end_locked(fiber, status=FiberStatus.CANCELLED, reason="its run was terminated")


def on_run_failed(run: WorkflowRun) -> None:
    """The hook (``workflows.hooks.on_run_failed``, the run row locked): a fiber whose run the engine
    failed outside its steps (too many lost workers, say) fails at once, saying why."""
    fiber = Fiber.objects.select_for_update().filter(run=run).first()
    if fiber is not None and fiber.status in FIBER_OPEN:
        why = str((run.error or {}).get("message") or run.failure_reason or run.status)
        end_locked(fiber, status=FiberStatus.FAILED, reason=f"its run ended: {why}"[:500], error=run.error)


def repair_locked(agent: Agent) -> None:
    """Fail the agent's open fibers whose run ended without ending them (the engine failed the run
    outside its steps: too many lost workers, say). Call inside atomic()."""
    stuck = (
        Fiber.objects.select_for_update(of=("self",))  # the fiber rows only: runs are locked before fibers
        .select_related("run")
        .filter(agent=agent, status__in=FIBER_OPEN, run__status__in=[RunStatus.FAILED, RunStatus.COMPLETED])
    )
    for fiber in stuck:
        assert fiber.run is not None
        why = str((fiber.run.error or {}).get("message") or fiber.run.failure_reason or fiber.run.status)
        end_locked(fiber, status=FiberStatus.FAILED, reason=f"its run ended: {why}"[:500], error=fiber.run.error)


# --- the workflow ----------------------------------------------------------------------------------------
# As agents.turn: its steps are the agent's, and it runs only for a fiber agents.services made.
@workflow(FIBER_WORKFLOW, internal=True, view_permission="agents.view_fiber")
class FiberWorkflow(Workflow):
    """Private: ``agents.services.fiber_start`` starts it (payload ``{"fiber": "<uuid>"}``)."""

    version = "1"

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        if set(payload) != {"fiber"}:
            raise InvalidPayload("the payload is {'fiber': <id>} and nothing else")
        try:
            UUID(str(payload["fiber"]))
        except ValueError:
            raise InvalidPayload("fiber must be a fiber's id") from None
        return payload

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        fiber_id = str(event.payload["fiber"])
        begun: dict[str, Any] = step.do("begin", fiber_begin, fiber_id, atomic=True)
        if begun.get("ended"):
            return {"status": begun["ended"]}
        try:
            out: dict[str, Any] = step.do(
                "body", fiber_body, fiber_id, retries=NO_RETRIES, timeout=conf()["MAX_STEP_TIMEOUT_SECONDS"]
            )
        except StepError as exc:
            error = {"type": exc.error_type, "message": exc.message}
            failed: dict[str, Any] = step.do("fail", fiber_fail, fiber_id, error, atomic=True)
            return failed
        ended: dict[str, Any] = step.do("finish", fiber_finish, fiber_id, out, atomic=True)
        return ended


# --- step bodies ----------------------------------------------------------------------------------------
def _lease() -> tuple[UUID, str]:
    ctx = current_step()
    if ctx is None or not ctx.owner:
        raise FencedOut("a fiber runs only in its run's steps, by the lease holder")
    return ctx.run_id, ctx.owner


def _locked(fiber_id: str) -> Fiber:
    """The fiber's row, locked after the run's (the lock order), inside an atomic step."""
    fence(*_lease())
    return Fiber.objects.select_for_update().select_related("agent").get(pk=fiber_id)


def fiber_begin(fiber_id: str) -> dict[str, Any]:
    fiber = _locked(fiber_id)
    if fiber.status != FiberStatus.PENDING:
        return {"ended": fiber.status} if fiber.is_ended else {}
    fiber.begin()
    fiber.save(update_fields=["status", "updated_at"])
    push_fiber(fiber)
    return {}


def fiber_body(fiber_id: str) -> dict[str, Any]:
    """Count the attempt (fenced), ask the agent what to do if this is a recovery, run the function."""
    run_id, owner = _lease()
    with transaction.atomic():
        fiber = _locked(fiber_id)
        if fiber.status != FiberStatus.RUNNING:
            return {"ended": fiber.status}
        fiber.attempts += 1
        fiber.save(update_fields=["attempts", "updated_at"])
    ctx = FiberContext(fiber=fiber, run_id=run_id, owner=owner)
    if ctx.recovered:
        choice = agent_of(fiber.agent).on_fiber_recovered(ctx)
        if choice not in FIBER_RECOVERY_CHOICES:
            raise ValueError(f"on_fiber_recovered returned {choice!r}, not one of {', '.join(FIBER_RECOVERY_CHOICES)}")
        logger.info("fiber %s (%s): recovered at attempt %s: %s", fiber.pk, fiber.name, ctx.attempt, choice)
        if choice == "cancel":
            return {"cancelled": f"cancelled on recovery (attempt {ctx.attempt})"}
        if choice == "restart":
            ctx.clear()
    value = resolve(fiber.fn)(ctx)
    return {"result": value}


def fiber_finish(fiber_id: str, out: dict[str, Any]) -> dict[str, Any]:
    fiber = _locked(fiber_id)
    if fiber.status not in FIBER_OPEN:
        return {"status": fiber.status}
    if "cancelled" in out:
        end_locked(fiber, status=FiberStatus.CANCELLED, reason=str(out["cancelled"]))
    else:
        end_locked(fiber, status=FiberStatus.COMPLETED, reason="completed", result=out.get("result"))
    return {"status": fiber.status}


def fiber_fail(fiber_id: str, error: dict[str, Any]) -> dict[str, Any]:
    fiber = _locked(fiber_id)
    if fiber.status not in FIBER_OPEN:
        return {"status": fiber.status}
    end_locked(fiber, status=FiberStatus.FAILED, reason=f"{error['type']}: {error['message']}", error=error)
    return {"status": fiber.status}
