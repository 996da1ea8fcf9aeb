"""Agents the test suite chats with in real worker processes (loaded through AGENTS_MODULES).

``test.chat`` answers from a script that reads the last user message, so a test chooses what the
model does by what it sends:

- ``story <words> <delay>``: an answer of ``<words>`` words ("w1 w2 …"), ``<delay>`` seconds each;
- ``record <path> [<delay>]``: calls ``record`` (appends a line to ``<path>``), then answers with its
  result (or, given a delay, with 21 words that slowly);
- ``refund <amount> <path>``: calls ``refund`` (needs approval by ``agents-test-approvers``;
  appends to ``<path>`` when it runs), then answers with its result;
- ``pay <path>``: calls ``pay`` (an Effect through the ledger; the adapter appends to ``<path>``);
- ``bad``: a call with malformed arguments; ``unknown``: a call of a tool that does not exist;
  ``boom``: a tool that raises;
- ``die <path>`` (``test.killing`` only): calls ``die``, which appends to ``<path>`` and SIGKILLs
  its own worker process, on every try;
- anything else: ``You said: <text>``.

Side effects go to files, so a test in another process sees exactly how often a tool ran.

``test.fibers`` runs fibers: ``count_items`` works through numbered items, appending each to a file
and stashing it as done, and ``FiberAgent.on_fiber_recovered`` writes what it was shown to a file.
"""

from __future__ import annotations

import json
import os
import signal
import time
from decimal import Decimal
from typing import Any

from agents.fibers import FiberContext
from agents.providers.base import ChatMessage, Finish, ModelEvent, ModelRequest, Provider, TextDelta, ToolCall
from agents.providers.scripted import ScriptedProvider
from agents.registry import Approval, ChatAgent, Effect, ToolContext, agent, tool
from agents.state import AgentStep, AgentWorkflow
from ledger import Succeeded, register_adapter
from workflows import workflow
from workflows.registry import Event

APPROVERS = "agents-test-approvers"


def append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def count(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(f.read().splitlines())


@tool
def record(ctx: ToolContext, path: str) -> dict[str, Any]:
    """Record that the tool ran.

    Args:
        path: the file to append to.
    """
    append(path, f"{ctx.turn_id} {ctx.call_id}")
    return {"recorded": count(path)}


@tool(needs_approval=Approval(approvers=APPROVERS, summary="Refund {amount} for the test"))
def refund(ctx: ToolContext, amount: Decimal, path: str) -> dict[str, Any]:
    """Refund an amount (needs approval).

    Args:
        amount: how much.
        path: the file to append to.
    """
    append(path, f"refund {amount}")
    return {"refunded": str(amount)}


@tool(effect=Effect(system="agents-test", action="pay"))
def pay(ctx: ToolContext, path: str) -> dict[str, Any]:
    """Pay once (an effect through the ledger).

    Args:
        path: the file the adapter appends to.
    """
    return {"path": path}


@tool
def explode(ctx: ToolContext) -> None:
    """A tool that raises."""
    raise RuntimeError("the tool broke")


@tool
def die(ctx: ToolContext, path: str) -> None:
    """Kill the worker process that runs it (a poison tool call).

    Args:
        path: the file to append to before dying.
    """
    append(path, "kill")
    os.kill(os.getpid(), signal.SIGKILL)


class FileAdapter:
    """The ``agents-test`` system: each submit appends to the request's file and succeeds."""

    can_lookup = False

    def submit(self, op: Any) -> Succeeded:
        append(op.request["path"], op.key)
        return Succeeded({"paid": True, "key": op.key})

    def lookup(self, op: Any) -> Any:
        raise NotImplementedError


register_adapter("agents-test", FileAdapter())


def _words(text: str, delay: float) -> tuple[list[ModelEvent], float]:
    words = text.split(" ")
    events: list[ModelEvent] = [TextDelta(w if i == 0 else f" {w}") for i, w in enumerate(words)]
    return [*events, Finish("stop")], delay


def script(request: ModelRequest) -> tuple[list[ModelEvent], float]:
    users = [m for m in request.messages if m.role == "user"]
    last: ChatMessage = request.messages[-1]
    asked = users[-1].content.split()
    call_id = f"t{len(users)}"
    command = asked[0] if asked else ""
    if last.role == "tool":
        if command == "record" and len(asked) > 2:  # record <path> <delay>: a slow answer after the tool
            return _words("Done: " + " ".join(f"d{i}" for i in range(1, 21)), float(asked[2]))
        return _words(f"Done: {last.content}", 0.0)
    if command == "story":
        n, delay = int(asked[1]), float(asked[2])
        return _words(" ".join(f"w{i}" for i in range(1, n + 1)), delay)
    calls: dict[str, ToolCall] = {
        "record": ToolCall(call_id, "record", {"path": asked[1] if len(asked) > 1 else ""}),
        "refund": ToolCall(call_id, "refund", {"amount": asked[1] if len(asked) > 2 else "1", "path": asked[-1]}),
        "pay": ToolCall(call_id, "pay", {"path": asked[-1]}),
        "bad": ToolCall(call_id, "record", None, error="the arguments were not JSON"),
        "unknown": ToolCall(call_id, "nope", {}),
        "boom": ToolCall(call_id, "explode", {}),
        "die": ToolCall(call_id, "die", {"path": asked[-1]}),
    }
    if command in calls:
        return [TextDelta("Let me do that."), calls[command], Finish("tool_calls")], 0.0
    return _words(f"You said: {users[-1].content}", 0.0)


@agent("test.chat")
class TestChat(ChatAgent):
    model = "scripted"
    system_prompt = "You are a test."
    tools = [record, refund, pay, explode]

    def provider(self) -> Provider:
        return ScriptedProvider(script)


@agent("test.sealing")
class Sealing(TestChat):
    """Seals on any recovery."""

    def on_chat_recovery(self, ctx: Any) -> Any:
        return "seal"


@agent("test.retrying")
class Retrying(TestChat):
    def on_chat_recovery(self, ctx: Any) -> Any:
        return "retry"


@workflow("test.agent-state")
class StateReport(AgentWorkflow):
    """Reports a process's stages to an agent's chat through its state (payload ``{"agent": id}``)."""

    def run_agent(self, event: Event, step: AgentStep) -> int:
        step.merge_agent_state({"refund": "submitted", "note": "x"})
        step.merge_agent_state({"note": None})
        return step.update_agent_state({"refund": "confirmed"})


@agent("test.killing")
class Killing(TestChat):
    """Has the ``die`` tool, whose every try kills its worker."""

    tools = [*TestChat.tools, die]


@agent("test.rules")
class RulesChat(ChatAgent):
    """The embedded rules model, with no tools: it says what it can do."""

    model = "rules"


@agent("test.abortable")
class Abortable(TestChat):
    """Its turns stop when the client that sent their message goes away."""

    cancel_on_client_abort = True


# --- fibers ---------------------------------------------------------------------------------------
def count_items(ctx: FiberContext) -> dict[str, Any]:
    """Items 1 … ``items`` of ``input``: each appends ``item <i>`` to ``path`` and is stashed as
    done (``{"done": i}``), ``delay`` seconds apart; a recovered run starts after the stashed one.
    Given ``hang_after`` k, the first attempt stops after stashing item k, writes ``<path>.hung``
    and sleeps, so a test kills its worker at a known point. Each start appends ``<attempt>
    <done>`` to ``<path>.attempts``."""
    path = str(ctx.input["path"])
    items, delay = int(ctx.input["items"]), float(ctx.input.get("delay", 0))
    done = int((ctx.stashed or {}).get("done", 0))
    append(f"{path}.attempts", f"{ctx.attempt} {done}")
    for i in range(done + 1, items + 1):
        time.sleep(delay)
        append(path, f"item {i}")
        ctx.stash({"done": i})
        if i == ctx.input.get("hang_after") and ctx.attempt == 1:
            append(f"{path}.hung", "")
            time.sleep(120)
    return {"items": count(path), "attempt": ctx.attempt}


def broken_fiber(ctx: FiberContext) -> None:
    raise RuntimeError("the fiber broke")


@agent("test.fibers")
class FiberAgent(TestChat):
    """Its ``on_fiber_recovered`` appends what it saw to ``<path>.recovered`` and answers the
    fiber's ``input["on_recovery"]`` (default continue)."""

    def on_fiber_recovered(self, ctx: FiberContext) -> Any:
        seen = {"name": ctx.name, "attempt": ctx.attempt, "recovered": ctx.recovered, "stashed": ctx.stashed}
        append(f"{ctx.input['path']}.recovered", json.dumps(seen))
        return ctx.input.get("on_recovery", "continue")
