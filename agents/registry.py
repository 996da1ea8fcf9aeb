"""``ChatAgent``, ``@agent(kind)`` and ``@tool``: how an app declares the agents its customers chat with.

An agent kind is a ``ChatAgent`` subclass registered under a name; its ``tools`` are plain typed
functions wrapped by ``@tool``, whose JSON schema (what the model sees) is read from the signature
and the docstring. Modules named ``agents.py`` in every installed app, and those listed in
``AGENTS_MODULES``, are imported at start-up so their agents register (``AgentsConfig.ready``).
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, overload

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from agents.fibers import FiberContext
    from agents.models import Agent, Fiber
    from agents.providers.base import Provider

Choice = Literal["continue", "retry", "seal"]
RECOVERY_CHOICES: tuple[Choice, ...] = ("continue", "retry", "seal")
FiberChoice = Literal["continue", "cancel", "restart"]
FIBER_RECOVERY_CHOICES: tuple[FiberChoice, ...] = ("continue", "cancel", "restart")


@dataclass(frozen=True)
class ToolContext:
    """What a tool's first parameter receives: the agent row, the turn, the call, who asked (None:
    no person did, the message came from a schedule, a webhook source or ``manage.py agents submit``)."""

    # What a tool that acts for the person who asked answers when no person did: it looks up and
    # does nothing for anyone (the model then says so, rather than "you have none").
    NO_ONE_ASKED: ClassVar[str] = (
        "no person asked this (it came from a schedule or another system), and this is told and done only "
        "for the person who asks: ask in the chat yourself"
    )

    agent: Agent
    turn_id: str
    call_id: str
    user: User | None


@dataclass(frozen=True)
class Approval:
    """``@tool(needs_approval=Approval(...))``: the call waits for a person of ``approvers`` (a group)
    to approve the exact arguments. ``summary`` is formatted with the arguments (``{amount}``)."""

    approvers: str
    summary: str = ""
    timeout: timedelta = timedelta(days=2)


@dataclass(frozen=True)
class Effect:
    """``@tool(effect=Effect(system, action))``: the function returns the request, and
    ``ledger.perform`` sends it once per tool call (key ``agent:<id>:turn:<id>:call:<call id>``)."""

    system: str
    action: str


@dataclass(frozen=True)
class RecoveryContext:
    """What ``on_chat_recovery`` decides on: a model round was interrupted (its worker died, or the
    model failed) after it had streamed something.

    ``attempt``: this recovery's number within the turn (1, 2, …); ``partial_text``: the round's
    text the customer has seen so far; ``created_at``: when the turn was created; ``kind``:
    ``"text"`` when text was streamed, ``"tool_calls"`` when only tool calls were."""

    attempt: int
    partial_text: str
    created_at: datetime
    kind: str


class ToolDefinitionError(TypeError):
    """A tool's signature uses a type the schema cannot express."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its schema. Calling it calls the function."""

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    needs_approval: Approval | None = None
    effect: Effect | None = None
    decimals: frozenset[str] = frozenset()  # parameters given to the model as strings, to the function as Decimal

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, needs_approval: Approval | None = None, effect: Effect | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    needs_approval: Approval | None = None,
    effect: Effect | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make ``fn(ctx: ToolContext, **arguments)`` a tool; bare (``@tool``) or with options."""

    def wrap(f: Callable[..., Any]) -> Tool:
        parameters, decimals = schema_of(f)
        return Tool(
            fn=f,
            name=name or f.__name__,
            description=_description(f),
            parameters=parameters,
            needs_approval=needs_approval,
            effect=effect,
            decimals=frozenset(decimals),
        )

    return wrap(fn) if fn is not None else wrap


# --- schema from a signature ------------------------------------------------------------------------
DECIMAL_PATTERN = r"^-?\d+(\.\d+)?$"


def schema_of(fn: Callable[..., Any]) -> tuple[dict[str, Any], list[str]]:
    """The JSON schema of ``fn``'s parameters after the first (the ToolContext), and the names of
    those typed Decimal (strings in the schema)."""
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]
    docs = _arg_docs(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    decimals: list[str] = []
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {fn.__name__}: *args and **kwargs cannot be described to a model")
        if param.name not in hints:
            raise ToolDefinitionError(f"tool {fn.__name__}: parameter {param.name!r} needs a type annotation")
        hint = hints[param.name]
        prop = _schema(hint, f"{fn.__name__}.{param.name}")
        if _is_decimal(hint):
            decimals.append(param.name)
        if param.name in docs:
            prop = {**prop, "description": docs[param.name]}
        if param.default is param.empty:
            required.append(param.name)
        elif isinstance(param.default, str | int | float | bool | type(None)):
            prop = {**prop, "default": param.default}
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, decimals


def _is_decimal(hint: Any) -> bool:
    return hint is Decimal or (_is_union(hint) and Decimal in typing.get_args(hint))


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _schema(hint: Any, where: str) -> dict[str, Any]:
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in simple:
        return {"type": simple[hint]}
    if hint is Decimal:
        return {"type": "string", "pattern": DECIMAL_PATTERN, "description": "a decimal number, as a string"}
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:
            return {"anyOf": [_schema(others[0], where), {"type": "null"}]}
        return {"anyOf": [_schema(a, where) for a in args]}
    if origin is Literal:
        values = list(args)
        kinds = {type(v) for v in values}
        schema: dict[str, Any] = {"enum": values}
        if len(kinds) == 1 and (kind := kinds.pop()) in simple:
            schema["type"] = simple[kind]
        return schema
    if hint is list or origin in (list, Sequence, tuple):
        items = [a for a in args if a is not Ellipsis]
        return {"type": "array", "items": _schema(items[0], where)} if items else {"type": "array"}
    if hint is dict or origin is dict:
        return {"type": "object"}
    raise ToolDefinitionError(f"tool parameter {where}: type {hint!r} cannot be described to a model")


def _description(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    head = re.split(r"\n\s*\n|\n\s*(?:Args|Arguments|Returns|Raises):", doc, maxsplit=1)[0]
    return " ".join(head.split())


def _arg_docs(fn: Callable[..., Any]) -> dict[str, str]:
    """``name: text`` (or ``name (type): text``) lines of the docstring's ``Args:`` section."""
    doc = inspect.getdoc(fn) or ""
    match = re.search(r"^(?:Args|Arguments):\s*\n(?P<body>(?:[ \t]+.*\n?|\s*\n)*)", doc, re.MULTILINE)
    if match is None:
        return {}
    found: dict[str, str] = {}
    current = ""
    for line in match["body"].splitlines():
        item = re.match(r"^\s{1,8}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if item is not None:
            current = item[1]
            found[current] = item[2].strip()
        elif current and line.strip():
            found[current] = f"{found[current]} {line.strip()}"
    return found


# --- agents -----------------------------------------------------------------------------------------
class ChatAgent:
    """Subclass, decorate with ``@agent("kind")``, and declare ``model``, ``system_prompt``, ``tools``.

    One instance is made per model round or tool call with the agent's row (``self.row``); keep no
    state on it: the agent's durable state is ``row.state`` (``agent_state_update``)."""

    kind: ClassVar[str] = ""
    model: ClassVar[str] = "rules"
    system_prompt: ClassVar[str] = ""
    tools: ClassVar[Sequence[Tool]] = ()
    # Closing the tab does not stop the turn; a client's explicit stop always does. True: a socket
    # that disconnects stops the turns its own messages started (``agents.consumers``).
    cancel_on_client_abort: ClassVar[bool] = False

    def __init__(self, row: Agent | None = None) -> None:
        self.row = row

    def provider(self) -> Provider:
        """The model this agent talks to (``agents.providers.get_provider(model)``)."""
        from agents.providers import get_provider

        return get_provider(self.model)

    def on_chat_recovery(self, ctx: RecoveryContext) -> Choice:
        """A model round was interrupted after streaming something: ``"continue"`` it from where it
        stopped (the default when text was streamed), ``"retry"`` it from its start (the customer's
        view drops the round's text), or ``"seal"`` the turn with what was delivered. A round
        interrupted before it streamed anything is simply run again, without asking."""
        return "continue" if ctx.partial_text else "retry"

    def run_fiber(
        self,
        name: str,
        fn: Callable[[FiberContext], Any] | str,
        idempotency_key: str | None = None,
        *,
        input: dict[str, Any] | None = None,
        user: User | None = None,
    ) -> Fiber:
        """Start a fiber of this agent: ``fn(ctx)``, a module-level function (or its ``module:name``),
        run durably in a worker (``agents.fibers``). The same ``idempotency_key`` returns the same
        fiber (FiberConflict if it was used for another name, function or input)."""
        from agents.services import fiber_start

        if self.row is None:
            raise ValueError("run_fiber needs the agent's row: ChatAgent(row)")
        return fiber_start(agent=self.row, name=name, fn=fn, input=input, idempotency_key=idempotency_key, user=user)

    def on_fiber_recovered(self, ctx: FiberContext) -> FiberChoice:
        """A fiber's worker died while its function ran, and the function is about to run again:
        ``ctx.stashed`` is its last stash (``ctx.recovered`` is True, ``ctx.attempt`` counts).
        ``"continue"`` (the default) runs the function again, which skips what its stash says is
        done; ``"restart"`` clears the stash and runs it from the start; ``"cancel"`` ends the fiber
        cancelled. Look at ``ctx.name`` when an agent runs several kinds of fiber."""
        return "continue"

    @classmethod
    def tool_named(cls, name: str) -> Tool | None:
        return next((t for t in cls.tools if t.name == name), None)


_registry: dict[str, type[ChatAgent]] = {}
A = TypeVar("A", bound="type[ChatAgent]")


def agent(kind: str) -> Callable[[A], A]:
    """Register the decorated ChatAgent subclass as ``kind``."""
    if not isinstance(kind, str) or not re.fullmatch(r"[\w.-]{1,64}", kind):
        raise ValueError(f"an agent kind is 1 to 64 letters, digits, '_', '-' or '.', not {kind!r}")

    def register(cls: A) -> A:
        if not (isinstance(cls, type) and issubclass(cls, ChatAgent)):
            raise TypeError(f"@agent({kind!r}) decorates a subclass of ChatAgent")
        existing = _registry.get(kind)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"agent {kind!r} is already registered by {existing.__module__}.{existing.__qualname__}")
        names = [t.name for t in cls.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"agent {kind!r}: two tools share a name ({', '.join(names)})")
        for t in cls.tools:
            if not isinstance(t, Tool):
                raise TypeError(f"agent {kind!r}: {t!r} is not a @tool")
        cls.kind = kind
        _registry[kind] = cls
        return cls

    return register


def get_agent_class(kind: str) -> type[ChatAgent] | None:
    return _registry.get(kind)


def agent_of(row: Agent) -> ChatAgent:
    """The registered ChatAgent class of ``row``'s kind, bound to it (LookupError if none is)."""
    cls = get_agent_class(row.kind)
    if cls is None:
        raise LookupError(f"no agent kind {row.kind!r} is registered")
    return cls(row)


def agent_kinds() -> list[str]:
    return sorted(_registry)


def import_agent_modules(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)
