"""What every model provider speaks: the request a turn's model step sends, and the events it streams back.

A provider is a plain Python object with no database of its own, so the agents app can run it in
a workflow step, a test or a benchmark alike. A stream yields ``TextDelta`` and ``ToolCall``
events and ends with exactly one ``Finish``, or raises ``ProviderError`` (then the caller may retry
the round; a retried round sends the text already delivered as ``ModelRequest.prefix``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call; ``parameters`` is the JSON schema of its arguments (an object)."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for (also a model event).

    ``arguments`` is None when the model sent arguments that are not a JSON object; ``error`` then
    says why, so the turn answers the call with a tool error instead of crashing.
    """

    id: str
    name: str
    arguments: dict[str, Any] | None
    error: str = ""


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation, in the provider-neutral shape."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages that called tools
    tool_call_id: str = ""  # tool messages: the call answered
    name: str = ""  # tool messages: the tool's name


@dataclass(frozen=True)
class ModelRequest:
    """One round of a turn: the model sees the system prompt, the conversation and the tools."""

    system: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    prefix: str = ""  # assistant text of this round already delivered (a recovered stream continues after it)


@dataclass(frozen=True)
class TextDelta:
    """A piece of the assistant's answer."""

    text: str


@dataclass(frozen=True)
class Finish:
    """The end of a stream, with why the model stopped: "stop", "tool_calls", "length", ..."""

    reason: str


ModelEvent = TextDelta | ToolCall | Finish


class Provider(Protocol):
    """A model: streams the events of one round."""

    name: str

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]: ...


class ProviderError(Exception):
    """The provider failed (network, HTTP status, a stream cut short): the caller may retry."""
