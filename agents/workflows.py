"""The ``agents.turn`` workflow: one turn of a chat, run by the engine like any other process.

Steps, in order (each name once per turn, so replay finds them):

- ``model 1``, ``model 2``, …: a model round. The body streams the provider's events as chunks
  (``start`` at the first round, ``text-delta`` per delta, ``tool-input-available`` per call) and
  returns the round's text and tool calls. The first round reads the conversation up to this
  turn's user message and returns it with its result, for the rounds after it. A round that
  answers without a tool call ends the turn itself, in one transaction with its last chunks: the
  turn's messages, text and status, the ``finish`` chunk, the start of the next turn.
- per tool call: ``tool <call id>``, which runs the tool (atomic, so a database-only tool happens
  once) or, for an ``Effect`` tool, ``ledger.perform`` with a key made of agent, turn and call (so a
  recovered worker never repeats the effect), and writes the ``tool-output-available`` chunk once.
  A tool with ``needs_approval`` first asks (``approval <call id>: ask``, the turn ``waiting``, a
  ``data-notice`` saying so), waits through ``approvals.wait_for_approval`` on the exact arguments,
  and records the answer (``approval <call id>: answer``); a rejection or expiry is the tool's result.
- ``finish`` (atomic): the same end for a turn that did not end in its last round (sealed, out of
  rounds, or a round whose end was fenced out).

Runs started at version 1 (before the first round read the conversation and the last one ended the
turn) keep their steps: a ``load`` step first, and always a ``finish`` step.

Recovery. A model round's body that runs again (its worker died, or the model failed) finds the
chunks its earlier try streamed: those after the ``seq`` the step before it ended with. None: it
just runs. Some: the agent's ``on_chat_recovery`` decides to continue (the provider gets the text
so far as ``prefix`` and streams only the rest), retry (a ``data-reset`` chunk, then anew) or seal.
Budgets: at most ``AGENTS_MAX_RECOVERIES`` recoveries per turn, and none after the stream was
silent for ``AGENTS_MAX_SILENCE_SECONDS``; past either the turn is sealed with a message the
customer sees. A round that starts more than ``AGENTS_STALE_TURN_SECONDS`` after the turn last moved
(its creation, or its last chunk before that round: an approval's answer, say) seals the turn
instead of answering late; time spent waiting for an approval therefore never counts.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agents.chunks import ChunkWriter, FencedOut, dumps, fence, last_seq
from agents.models import TURN_ACTIVE, TURN_FINISH_REASONS, TURN_OPEN, Chunk, Message, MessageRole, Turn, TurnStatus
from agents.registry import RECOVERY_CHOICES, RecoveryContext, Tool, ToolContext, agent_of, get_agent_class
from agents.services import end_locked, push_message, push_turn
from agents.statements import newest_messages, turn_locked_for_end, turn_with_seq
from approvals import ApprovalExpired, ApprovalRejected, wait_for_approval
from workflows import NonRetryableError, Retries, StepError, Workflow, current_step, workflow
from workflows.exceptions import InvalidPayload
from workflows.registry import Event

if TYPE_CHECKING:
    from workflows.engine import Step

logger = logging.getLogger(__name__)

STREAMED = ("text-delta", "tool-input-available")  # what a round's own try streamed
MODEL_RETRIES = Retries(limit=3, delay=timedelta(seconds=1), backoff="constant")
TOOL_RETRIES = Retries(limit=3, delay=timedelta(seconds=2), backoff="exponential")

BUDGET_MESSAGE = "Sorry: this answer was interrupted too many times and could not be finished. Please ask again."
STALE_MESSAGE = "Sorry: this question waited too long to be answered, so it was closed. Please ask again."
SEALED_MESSAGE = "This answer was interrupted and has been closed as it stands."
FAILED_MESSAGE = "Sorry: something went wrong and this answer could not be finished. Please try again."
ROUNDS_MESSAGE = "Sorry: this question needed more steps than I may take in one answer."


# Its steps hold the conversation it answered: its runs are for who may read the agents' turns,
# not for the member who sent the message once they leave the account, nor for staff who read runs.
@workflow("agents.turn", internal=True, view_permission="agents.view_turn")
class TurnWorkflow(Workflow):
    """Private: ``agents.services`` starts it when a turn's time comes (payload ``{"turn": uuid}``)."""

    # 2: no ``load`` step (the first round reads the conversation) and no ``finish`` step after a
    # round that answers (it ends the turn itself): a turn that needs no tool is one step, where it
    # was three.
    version = "2"

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            UUID(str(payload.get("turn")))
        except ValueError:
            raise InvalidPayload("turn must be a turn's id") from None
        if set(payload) != {"turn"}:
            raise InvalidPayload("the payload is {'turn': <id>} and nothing else")
        return payload

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        turn_id = str(event.payload["turn"])
        # A restarted run's new attempt finds the stream of the attempts before it: it reads the
        # stream's last seq first (the load step), so its first round starts after it instead of
        # taking that stream for its own interrupted try.
        legacy = event.version == "1" or event.attempt > 1
        try:
            return self.converse(step, turn_id, legacy=legacy)
        except StepError as exc:
            if exc.error_type == ForeignTurn.__name__:
                raise  # not this run's turn: the run fails and the turn is left as it is
            # A step that failed for good (the model kept failing, a tool's effect stayed unsettled):
            # the customer sees that the answer could not be finished.
            step.do("fail", turn_fail, turn_id, f"{exc.error_type}: {exc.message}", atomic=True)
            return {"status": TurnStatus.FAILED}

    def converse(self, step: Step, turn_id: str, *, legacy: bool) -> dict[str, Any]:
        loaded: dict[str, Any] = {}  # the agent's kind, who asked, the conversation before the turn
        history: list[dict[str, Any]] | None = None  # None: the first round reads it
        seq = 0
        if legacy:
            loaded = step.do("load", load_turn, turn_id)
            if loaded.get("ended"):
                return {"status": loaded["ended"]}
            history, seq = loaded["messages"], int(loaded["seq"])
        added: list[dict[str, Any]] = []  # what this turn adds to the conversation
        texts: list[str] = []
        for number in range(1, int(settings.AGENTS_MAX_ROUNDS) + 1):
            messages = None if history is None else history + added
            ends = None if legacy else added  # a round may end the turn: with what the turn adds
            out: dict[str, Any] = step.do(
                f"model {number}", model_round, turn_id, number, messages, seq, ends, retries=MODEL_RETRIES
            )
            if out.get("loaded"):
                loaded = out["loaded"]
                history = loaded["messages"]
            if out.get("finished"):
                return {"status": out["finished"]}
            seq = int(out["seq"])
            if out["text"]:
                texts.append(out["text"])
            if out.get("end"):
                if out["text"]:
                    added.append({"role": "assistant", "content": out["text"]})
                return self.finish(step, turn_id, TurnStatus.SEALED, texts, added, out["end"])
            calls: list[dict[str, Any]] = out["tool_calls"]
            added.append({"role": "assistant", "content": out["text"], "tool_calls": calls})
            if not calls:
                return self.finish(step, turn_id, TurnStatus.COMPLETED, texts, added, "answered")
            for call in calls:
                result, seq = self.call_tool(step, turn_id, loaded, call, seq)
                added.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": result})
        return self.finish(step, turn_id, TurnStatus.SEALED, texts, added, "too many rounds", ROUNDS_MESSAGE)

    def call_tool(
        self, step: Step, turn_id: str, loaded: dict[str, Any], call: dict[str, Any], seq: int
    ) -> tuple[Any, int]:
        agent_cls = get_agent_class(loaded["kind"])
        tool = agent_cls.tool_named(call["name"]) if agent_cls is not None else None
        denied = ""
        if tool is not None and tool.needs_approval is not None and not argument_problem(tool, call):
            approval = tool.needs_approval
            asked: dict[str, Any] = step.do(
                f"approval {call['id']}: ask", approval_ask, turn_id, call, approval.approvers, atomic=True
            )
            seq = int(asked["seq"])
            try:
                wait_for_approval(
                    step,
                    name=f"approval {call['id']}",
                    subject=("agents.turn", turn_id),
                    version=arguments_version(call),
                    summary=approval_summary(tool, call),
                    approvers=approval.approvers,
                    timeout=approval.timeout,
                    content={"tool": tool.name, "arguments": call["arguments"]},
                    requested_by=loaded["user"],
                )
            except ApprovalRejected:
                denied = "The request was not approved: an approver rejected it."
            except ApprovalExpired:
                denied = "The request was not approved in time: it expired."
            answered: dict[str, Any] = step.do(
                f"approval {call['id']}: answer", approval_answer, turn_id, call["id"], denied, atomic=True
            )
            seq = int(answered["seq"])
        atomic = tool is None or tool.effect is None  # ledger.perform refuses to run inside a transaction
        out: dict[str, Any] = step.do(
            f"tool {call['id']}", run_tool, turn_id, call, denied, atomic=atomic, retries=TOOL_RETRIES
        )
        return out["result"], max(seq, int(out["seq"]))

    def finish(
        self,
        step: Step,
        turn_id: str,
        status: str,
        texts: list[str],
        added: list[dict[str, Any]],
        reason: str,
        notice: str = "",
    ) -> dict[str, Any]:
        outcome = {
            "status": status,
            "text": "\n\n".join(texts),
            "reason": reason,
            "messages": added,
            "notice": notice,
        }
        ended: dict[str, Any] = step.do("finish", turn_finish, turn_id, outcome, atomic=True)
        return ended


# --- helpers the workflow code calls (deterministic) ----------------------------------------------
def argument_problem(tool: Tool, call: dict[str, Any]) -> str:
    """Why the call's arguments do not fit the tool's schema, or ""."""
    if call.get("error"):
        return str(call["error"])
    arguments = call.get("arguments")
    if not isinstance(arguments, dict):
        return "the arguments are not a JSON object"
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    error = best_match(Draft202012Validator(tool.parameters).iter_errors(arguments))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path)
        return f"invalid arguments{' (' + where + ')' if where else ''}: {error.message}"[:500]
    return ""


def arguments_version(call: dict[str, Any]) -> str:
    """The version under review: a hash of the exact arguments (canonical JSON)."""
    text = json.dumps(call["arguments"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def approval_summary(tool: Tool, call: dict[str, Any]) -> str:
    assert tool.needs_approval is not None
    template = tool.needs_approval.summary
    try:
        return (template.format(**call["arguments"]) if template else "") or f"{tool.name} {dumps(call['arguments'])}"
    except (KeyError, IndexError, ValueError, AttributeError):
        return f"{template} ({tool.name} {dumps(call['arguments'])})"


# --- step bodies ------------------------------------------------------------------------------------
def _writer(turn: Turn, *, seq: int | None = None) -> ChunkWriter:
    ctx = current_step()
    if ctx is None or not ctx.owner:
        raise FencedOut("a turn's chunks are written only from its run's steps, by the lease holder")
    return ChunkWriter(turn=turn, run_id=ctx.run_id, owner=ctx.owner, seq=seq)


def _fence() -> None:
    ctx = current_step()
    if ctx is None or not ctx.owner:
        raise FencedOut("not inside a step of the turn's run")
    fence(ctx.run_id, ctx.owner)


def _turn(turn_id: str) -> Turn:
    return Turn.objects.select_related("agent").get(pk=turn_id)


class ForeignTurn(NonRetryableError):
    """A run was started for a turn that is not its own (only ``agents.services`` starts a turn's
    run; a schedule or a webhook source naming ``agents.turn`` must not answer someone's turn)."""


def _check_own(turn: Turn) -> None:
    context = current_step()
    if context is not None and turn.run_id != context.run_id:
        raise ForeignTurn(f"turn {turn.pk} is answered by another run")


def load_turn(turn_id: str) -> dict[str, Any]:
    """The ``load`` step of a run started at version 1: the conversation (``conversation``) and the
    stream's last ``seq``."""
    turn = _turn(turn_id)
    _check_own(turn)
    if turn.status not in TURN_OPEN:
        return {"ended": turn.status}
    return {**conversation(turn), "seq": last_seq(turn.pk)}


def conversation(turn: Turn) -> dict[str, Any]:
    """The conversation as the model sees it in this turn: every message of the turns before it and
    this turn's user message (later turns' messages are queued behind it; this turn's own answer is
    written when it ends), with the agent's kind and who asked."""
    newest = newest_messages(turn, int(settings.AGENTS_HISTORY_MESSAGES))
    return {
        "kind": turn.agent.kind,
        "user": turn.requested_by_id,
        "messages": recent_history([message_for_model(*m) for m in reversed(newest)]),
    }


def recent_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest part of the conversation that fits in AGENTS_HISTORY_CHARS of JSON, starting at a
    user message (a tool result without the call before it means nothing to a model). The turn's
    own message is the last one and always stays: a conversation may grow for ever, a turn's
    ``load`` step (a stored result, bounded by WORKFLOWS_MAX_RESULT_BYTES) may not."""
    budget = int(settings.AGENTS_HISTORY_CHARS)
    sizes = [len(json.dumps(m, default=str)) for m in messages]
    start, total = len(messages), 0
    while start > 0 and (start == len(messages) or total + sizes[start - 1] <= budget):
        start -= 1
        total += sizes[start]
    while start < len(messages) - 1 and messages[start]["role"] != "user":
        start += 1
    return messages[start:]


def message_for_model(role: str, text: str, parts: dict[str, Any] | None) -> dict[str, Any]:
    """A stored message (its role, text and parts) as the model reads it."""
    parts = parts or {}
    if role == MessageRole.ASSISTANT:
        return {"role": "assistant", "content": text, "tool_calls": parts.get("tool_calls", [])}
    if role == MessageRole.TOOL:
        return {
            "role": "tool",
            "tool_call_id": parts.get("tool_call_id", ""),
            "name": parts.get("name", ""),
            "content": parts.get("result"),
        }
    return {"role": "user", "content": text}


def _chat_messages(messages: list[dict[str, Any]]) -> tuple[Any, ...]:
    from agents.providers.base import ChatMessage, ToolCall

    out = []
    for m in messages:
        content = m.get("content")
        out.append(
            ChatMessage(
                role=m["role"],
                content=content if isinstance(content, str) else dumps(content),
                tool_calls=tuple(
                    ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments")) for c in m.get("tool_calls", [])
                ),
                tool_call_id=m.get("tool_call_id", ""),
                name=m.get("name", ""),
            )
        )
    return tuple(out)


def _stale_since(turn: Turn, base_seq: int) -> Any:
    """When the turn last moved before this round: its last chunk up to ``base_seq``, or its creation."""
    last = Chunk.objects.filter(turn=turn, seq__lte=base_seq).order_by("-seq").values_list("created_at", flat=True)
    return last.first() or turn.created_at


def _is_stale(turn: Turn, base_seq: int, now: Any) -> bool:
    """Whether the turn has not moved for AGENTS_STALE_TURN_SECONDS before this round. A turn younger
    than that cannot be (its chunks are all newer than it): no query then, the common case."""
    limit = float(settings.AGENTS_STALE_TURN_SECONDS)
    if (now - turn.created_at).total_seconds() <= limit:
        return False
    return bool((now - _stale_since(turn, base_seq)).total_seconds() > limit)


def model_round(
    turn_id: str,
    number: int,
    messages: list[dict[str, Any]] | None,
    base_seq: int,
    ends: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One model round: stream the provider's events as chunks; return the text and tool calls.

    ``messages`` None (the first round): read the conversation, and return it as ``loaded``.
    ``ends`` (what the turn added before this round; None for a run started at version 1): a round
    that answers without a tool call ends the turn (``finished``: its status)."""
    from agents.providers.base import Finish, ModelRequest, TextDelta, ToolCall, ToolSpec

    turn, seq = turn_with_seq(turn_id)
    _check_own(turn)
    writer = _writer(turn, seq=seq)
    if turn.status not in TURN_ACTIVE:
        return {"text": "", "tool_calls": [], "seq": writer.seq, "end": f"the turn is {turn.status}"}
    agent = agent_of(turn.agent)
    loaded = conversation(turn) if messages is None else None
    if loaded is not None:
        messages = loaded["messages"]
    assert messages is not None
    if number == 1 and writer.seq == 0:
        writer.add("start", {}, hold=True)  # stored with the first delta
    elif number == 1 and ends is None and not Chunk.objects.filter(turn=turn, type="start").exists():
        # A run of version 1, or a restarted attempt, on a stream without its start (an earlier try
        # of this round may have stored it, keyed, then died).
        writer.add_once("start", {}, key="start")
    now = timezone.now()

    def seal(partial: str, reason: str, notice: str) -> dict[str, Any]:
        writer.add("data-notice", {"text": notice})
        writer.close()
        return {"text": partial, "tool_calls": [], "seq": writer.seq, "end": reason}

    earlier: list[tuple[str, Any, datetime]] = []  # nothing stored after the base: no earlier try streamed
    if writer.seq > base_seq:
        after = Chunk.objects.filter(turn=turn, seq__gt=base_seq).order_by("seq")
        earlier = list(after.values_list("type", "data", "created_at"))
    prefix = ""
    if any(t in STREAMED for t, _, _ in earlier):
        partial = ""
        for type_, data, _ in earlier:
            if type_ == "data-reset":
                partial = ""
            elif type_ == "text-delta":
                partial += str(data.get("delta", ""))
        attempt = turn.recoveries + 1
        Turn.objects.filter(pk=turn.pk).update(recoveries=F("recoveries") + 1)
        silent = (now - earlier[-1][2]).total_seconds()
        if attempt > int(settings.AGENTS_MAX_RECOVERIES):
            return seal(partial, f"out of recovery budget ({attempt - 1} recoveries)", BUDGET_MESSAGE)
        if silent > float(settings.AGENTS_MAX_SILENCE_SECONDS):
            return seal(partial, f"out of recovery budget (silent for {silent:.0f}s)", BUDGET_MESSAGE)
        if _is_stale(turn, base_seq, now):
            return seal(partial, "stale", STALE_MESSAGE)
        kind = "text" if partial else "tool_calls"
        choice = agent.on_chat_recovery(
            RecoveryContext(attempt=attempt, partial_text=partial, created_at=turn.created_at, kind=kind)
        )
        if choice not in RECOVERY_CHOICES:
            logger.warning("turn %s: on_chat_recovery returned %r; sealing", turn.pk, choice)
            choice = "seal"
        if choice == "seal":
            return seal(partial, "sealed on recovery", SEALED_MESSAGE)
        if choice == "retry":
            writer.add("data-reset", {"round": number})
        else:
            prefix = partial
    elif _is_stale(turn, base_seq, now):
        return seal("", "stale", STALE_MESSAGE)

    request = ModelRequest(
        system=agent.system_prompt,
        messages=_chat_messages(messages),
        tools=tuple(ToolSpec(t.name, t.description, t.parameters) for t in agent.tools),
        prefix=prefix,
    )
    text, calls = prefix, []
    try:
        for event in agent.provider().stream(request):
            if isinstance(event, TextDelta):
                if event.text:
                    text += event.text
                    writer.add("text-delta", {"delta": event.text})
            elif isinstance(event, ToolCall):
                call = {"id": event.id, "name": event.name, "arguments": event.arguments, "error": event.error}
                calls.append(call)
                data = {"toolCallId": event.id, "toolName": event.name, "input": event.arguments}
                writer.add_once("tool-input-available", data, key=f"input:{event.id}")
            elif isinstance(event, Finish):
                break
        if ends is not None and not calls:
            if (finished := answered(turn, writer, ends, text)) is not None:
                return {"text": text, "tool_calls": [], "seq": writer.seq, "finished": finished}
    finally:
        try:
            writer.close()  # what was streamed is the customer's, whatever happens next
        except FencedOut:
            pass
    out = {"text": text, "tool_calls": calls, "seq": writer.seq}
    return {**out, "loaded": loaded} if loaded is not None else out


def answer_text(messages: list[dict[str, Any]]) -> str:
    """A turn's answer: the text of each round that said something (a round may only call tools)."""
    return "\n\n".join(m["content"] for m in messages if m["role"] == "assistant" and m["content"])


def answered(turn: Turn, writer: ChunkWriter, added: list[dict[str, Any]], text: str) -> str | None:
    """End the turn the round answered, in one transaction with its last chunks; its status. None if
    the run's lease is gone (the run's next boundary finds it so, or the ``finish`` step ends it)."""
    answer = [*added, {"role": "assistant", "content": text, "tool_calls": []}]
    outcome = {
        "status": TurnStatus.COMPLETED,
        "text": answer_text(answer),
        "reason": "answered",
        "messages": answer,
        "notice": "",
    }
    try:
        with transaction.atomic():
            return str(end_turn(str(turn.pk), outcome, writer)["status"])
    except FencedOut:
        return None


def run_tool(turn_id: str, call: dict[str, Any], denied: str) -> dict[str, Any]:
    """Run one tool call (or answer it with why it cannot run) and stream its output once."""
    if connection.in_atomic_block:
        _fence()  # the run's row, before anything the tool locks
    turn = _turn(turn_id)
    writer = _writer(turn)
    key = f"output:{call['id']}"
    stored = Chunk.objects.filter(turn=turn, key=key).values_list("data", flat=True).first()
    if stored is not None:  # it ran, and its output was stored, before this worker died
        return {"result": stored.get("output"), "seq": writer.seq}
    result = denied_result(denied) if denied else invoke(turn, call)
    writer.add_once("tool-output-available", {"toolCallId": call["id"], "output": result}, key=key)
    writer.close()
    return {"result": result, "seq": writer.seq}


def denied_result(why: str) -> dict[str, Any]:
    return {"error": why}


def invoke(turn: Turn, call: dict[str, Any]) -> Any:
    """The tool's result as JSON; any problem (unknown tool, bad arguments, the tool raised) is a
    result ``{"error": …}`` that the model reads, never a crash of the turn."""
    from ledger import OperationFailed, perform

    agent = agent_of(turn.agent)
    tool = agent.tool_named(call["name"])
    if tool is None:
        return {"error": f"there is no tool called {call['name']!r}"}
    if problem := argument_problem(tool, call):
        return {"error": problem}
    arguments = dict(call["arguments"])
    for name in tool.decimals:
        if arguments.get(name) is not None:
            try:
                arguments[name] = Decimal(str(arguments[name]))
            except InvalidOperation:
                return {"error": f"{name} must be a decimal number"}
    ctx = ToolContext(agent=turn.agent, turn_id=str(turn.pk), call_id=call["id"], user=turn.requested_by)
    try:
        if tool.effect is not None:
            request = tool.fn(ctx, **arguments)
            key = f"agent:{turn.agent_id}:turn:{turn.pk}:call:{call['id']}"
            try:
                value = perform(key=key, system=tool.effect.system, action=tool.effect.action, request=request)
            except OperationFailed as exc:
                return {"error": f"the {tool.effect.system} system refused it: {exc}"}
        elif connection.in_atomic_block:
            with transaction.atomic():  # a savepoint: a tool that fails leaves none of its writes
                value = tool.fn(ctx, **arguments)
        else:
            value = tool.fn(ctx, **arguments)
        return json.loads(dumps(value))
    except Exception as exc:
        from ledger import OperationInProgress, OutcomeUnknown, ProviderUnavailable

        if isinstance(exc, (OutcomeUnknown, OperationInProgress, ProviderUnavailable, FencedOut)):
            raise  # unsettled: the step is tried again, and perform answers for the same key
        logger.info("turn %s: tool %s raised", turn.pk, call["name"], exc_info=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}


def approval_ask(turn_id: str, call: dict[str, Any], approvers: str) -> dict[str, Any]:
    """The turn waits for a person: ``waiting``, and a notice in the chat saying by whom."""
    _fence()
    turn = Turn.objects.select_for_update().select_related("agent").get(pk=turn_id)
    if turn.status == TurnStatus.RUNNING:
        turn.await_approval()
        turn.save(update_fields=["status"])
        push_turn(turn)
    writer = _writer(turn)
    writer.add_once("data-notice", {"text": f"Waiting for approval by {approvers}…"}, key=f"ask:{call['id']}")
    return {"seq": writer.seq}


def approval_answer(turn_id: str, call_id: str, denied: str) -> dict[str, Any]:
    """The decision came (or the request expired): the turn runs again and the chat says so."""
    _fence()
    turn = Turn.objects.select_for_update().select_related("agent").get(pk=turn_id)
    if turn.status == TurnStatus.WAITING:
        turn.resume()
        turn.save(update_fields=["status"])
        push_turn(turn)
    writer = _writer(turn)
    writer.add_once("data-notice", {"text": denied or "Approved."}, key=f"answer:{call_id}")
    return {"seq": writer.seq}


def turn_finish(turn_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """The ``finish`` step (atomic): ``end_turn``, in one transaction with the step's result."""
    return end_turn(turn_id, outcome)


def _lock_for_end(turn_id: str) -> Turn:
    """In one statement, inside atomic(): the run's row (its lease: FencedOut if it is not this
    worker's), then the agent's row, the queue's lock (the lock order), and the turn read.

    The turn is read, not locked: while this worker's lease is share-locked nothing else can end an
    active turn (a stop, a terminate and the failure hooks lock its run first, and the queue's
    services only start queued turns)."""
    ctx = current_step()
    if ctx is None or not ctx.owner:
        raise FencedOut("not inside a step of the turn's run")
    turn = turn_locked_for_end(turn_id, run_id=ctx.run_id, owner=ctx.owner)
    if turn is None:
        raise FencedOut(f"run {ctx.run_id}: the lease is not {ctx.owner!r}'s")
    return turn


def end_turn(turn_id: str, outcome: dict[str, Any], writer: ChunkWriter | None = None) -> dict[str, Any]:
    """The turn's end (inside atomic()): its messages, text, status and ``finish`` chunk, and the
    start of the next queued turn. ``writer``: a round's, whose last chunks go in the same INSERT."""
    turn = _lock_for_end(turn_id)
    if turn.status not in TURN_OPEN:
        return {"status": turn.status}
    rows = []
    for m in outcome["messages"]:
        if m["role"] == "assistant":
            parts = {"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {}
            rows.append(
                Message(agent_id=turn.agent_id, turn=turn, role=MessageRole.ASSISTANT, text=m["content"], parts=parts)
            )
        else:
            parts = {"tool_call_id": m["tool_call_id"], "name": m["name"], "result": m["content"]}
            rows.append(Message(agent_id=turn.agent_id, turn=turn, role=MessageRole.TOOL, parts=parts))
    for row in Message.objects.bulk_create(rows):
        push_message(row)
    writer = writer or _writer(turn)
    if outcome.get("notice"):
        writer.add("data-notice", {"text": outcome["notice"]})
    writer.add("finish", {"reason": TURN_FINISH_REASONS[outcome["status"]]})
    writer.close()
    end_locked(turn, status=outcome["status"], reason=outcome["reason"], text=outcome["text"])
    return {"status": outcome["status"]}


def turn_fail(turn_id: str, message: str) -> dict[str, Any]:
    """The turn failed: the customer reads that it could not be finished; staff read why."""
    turn = _lock_for_end(turn_id)
    if turn.status not in TURN_OPEN:
        return {"status": turn.status}
    writer = _writer(turn)
    writer.add("data-notice", {"text": FAILED_MESSAGE})
    writer.add("finish", {"reason": TURN_FINISH_REASONS[TurnStatus.FAILED]})
    writer.close()
    end_locked(turn, status=TurnStatus.FAILED, reason=message)
    return {"status": TurnStatus.FAILED}
