"""Any OpenAI-compatible server (OpenAI, vLLM, llama.cpp, Ollama, ...) over ``/chat/completions``.

One round is one streamed POST through ``httpx``: the system prompt and the conversation (an
assistant's ``tool_calls`` and the ``tool`` messages that answer them in OpenAI's shape) and the
tools as function specs. The answer comes back as server-sent events, one JSON chunk per
``data:`` line, until ``data: [DONE]``. Text is yielded as it arrives; tool calls are yielded once
the stream has ended, because their deltas are only complete then.

Servers differ in how they stream tool calls, so the deltas are accumulated leniently
(``ToolCallAccumulator``): a delta without an index continues the call with its id, or the last
call; a call without an id gets one made of the round, its position, name and arguments; a new id
(or a different name) at an index already used starts a new call, for servers that send parallel
calls all at index 0; argument strings are joined wherever they were split, and none at all is
``{}``. Arguments that are not a JSON object become ``ToolCall(arguments=None, error=...)``, which
the turn answers with a tool error: a model's mistake is never a crash.

A recovered round (``ModelRequest.prefix``) sends the text already delivered as a trailing
assistant message and, unless ``AGENTS_OPENAI_CONTINUE_FINAL_MESSAGE`` is off, asks the server to
continue that message (``continue_final_message: true, add_generation_prompt: false``, understood
by vLLM and others; OpenAI's own API refuses unknown fields, so turn it off there). The server then
streams only the rest; llama.cpp and Ollama continue a trailing assistant message without being
asked.

HTTP error statuses, timeouts, dropped connections, chunks that are not JSON, an error sent in the
stream and a stream that ends with neither a ``finish_reason`` nor ``[DONE]`` raise
``ProviderError``, which the caller may retry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agents.providers.base import (
    ChatMessage,
    Finish,
    ModelEvent,
    ModelRequest,
    ProviderError,
    TextDelta,
    ToolCall,
    ToolSpec,
)

DEFAULT_TIMEOUT = 30.0
# OpenAI's finish reasons, and the other names servers use for them.
FINISH_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
}
ERROR_BODY_CHARS = 300  # of an error response, quoted in the ProviderError


@dataclass(frozen=True)
class OpenAIConfig:
    """The ``AGENTS_OPENAI_*`` settings, read when a round starts."""

    base_url: str
    api_key: str
    model: str
    timeout: float
    continue_final_message: bool

    @classmethod
    def from_settings(cls) -> OpenAIConfig:
        config = cls(
            base_url=str(getattr(settings, "AGENTS_OPENAI_BASE_URL", "")).rstrip("/"),
            api_key=str(getattr(settings, "AGENTS_OPENAI_API_KEY", "")),
            model=str(getattr(settings, "AGENTS_OPENAI_MODEL", "")),
            timeout=float(getattr(settings, "AGENTS_OPENAI_TIMEOUT", DEFAULT_TIMEOUT)),
            continue_final_message=bool(getattr(settings, "AGENTS_OPENAI_CONTINUE_FINAL_MESSAGE", True)),
        )
        if not config.base_url or not config.model:
            raise ImproperlyConfigured("the openai model needs AGENTS_OPENAI_BASE_URL and AGENTS_OPENAI_MODEL")
        return config


class OpenAIProvider:
    """Streams a round from the OpenAI-compatible server the settings name."""

    name = "openai"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        config = OpenAIConfig.from_settings()
        headers = {"Accept": "text/event-stream"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        url = f"{config.base_url}/chat/completions"
        try:
            with (
                httpx.Client(timeout=config.timeout) as client,
                client.stream("POST", url, json=request_body(request, config), headers=headers) as response,
            ):
                if response.status_code >= 400:
                    detail = response.read().decode("utf-8", "replace")[:ERROR_BODY_CHARS]
                    raise ProviderError(f"the model server answered HTTP {response.status_code}: {detail}")
                yield from stream_events(response.iter_lines(), seed=str(len(request.messages)))
        except httpx.HTTPError as error:
            raise ProviderError(f"the model server failed: {type(error).__name__}: {error}") from error


# -- the request


def request_body(request: ModelRequest, config: OpenAIConfig) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(wire_message(message) for message in request.messages)
    body: dict[str, Any] = {"model": config.model, "stream": True, "messages": messages}
    if request.tools:
        body["tools"] = [wire_tool(tool) for tool in request.tools]
    if request.prefix:
        messages.append({"role": "assistant", "content": request.prefix})
        if config.continue_final_message:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    return body


def wire_message(message: ChatMessage) -> dict[str, Any]:
    """A message in OpenAI's shape. A call whose arguments were refused is sent back with ``{}``:
    the tool message that answers it carries the error."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments or {})},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def wire_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


# -- the answer


def stream_events(lines: Iterable[str], *, seed: str) -> Iterator[ModelEvent]:
    """The events of one streamed answer, from its server-sent event lines.

    ``seed`` tells rounds apart in the ids made up for calls that came without one.
    """
    calls = ToolCallAccumulator()
    reported: str | None = None
    done = False
    for line in lines:
        data = sse_data(line)
        if data is None:
            continue
        if data == "[DONE]":
            done = True
            break
        for choice in choices(parse_chunk(data)):
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                if isinstance(content, str) and content:
                    yield TextDelta(content)
                for call_delta in delta.get("tool_calls") or ():
                    calls.add(call_delta)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                reported = reason
    if not done and reported is None:
        raise ProviderError("the model's stream ended before it finished")
    finished = calls.finished(seed)
    yield from finished
    yield Finish(finish_reason(reported, called=bool(finished)))


def sse_data(line: str) -> str | None:
    """The payload of a ``data:`` line; None for comments, other fields and the blank lines between events."""
    if not line.startswith("data:"):
        return None
    return line[len("data:") :].strip()


def parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError as error:
        raise ProviderError(f"the model server sent a chunk that is not JSON: {data[:80]!r}") from error
    if not isinstance(chunk, dict):
        raise ProviderError(f"the model server sent a chunk that is not an object: {data[:80]!r}")
    if chunk.get("error"):
        raise ProviderError(f"the model server reported an error: {json.dumps(chunk['error'])[:ERROR_BODY_CHARS]}")
    return chunk


def choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The first choice's parts of a chunk (a usage-only chunk has none)."""
    found = chunk.get("choices")
    if not isinstance(found, list):
        return []
    return [c for c in found if isinstance(c, dict) and c.get("index") in (0, None)]


def finish_reason(reported: str | None, *, called: bool) -> str:
    """OpenAI's name for why the model stopped; a server that says "stop" after calling tools meant tool_calls."""
    reason = FINISH_REASONS.get(reported or "", reported or "")
    if called and reason in ("", "stop"):
        return "tool_calls"
    return reason or "stop"


@dataclass
class PendingCall:
    """A tool call whose deltas are still arriving."""

    index: int | None
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def starts_new(self, call_id: str, name: str) -> bool:
        """A delta with another id or another tool's name is a new call, even at this call's index."""
        return bool(call_id and self.id and call_id != self.id) or bool(name and self.name and name != self.name)


class ToolCallAccumulator:
    """Joins the streamed deltas of tool calls into calls, tolerant of how servers differ."""

    def __init__(self) -> None:
        self.calls: list[PendingCall] = []
        self.at_index: dict[int, PendingCall] = {}

    def add(self, delta: object) -> None:
        if not isinstance(delta, dict):
            return
        index = delta.get("index")
        call_id = str(delta.get("id") or "")
        function = delta.get("function")
        function = function if isinstance(function, dict) else {}
        name = str(function.get("name") or "")
        call = self.target(index if isinstance(index, int) and not isinstance(index, bool) else None, call_id, name)
        call.id = call.id or call_id
        call.name = call.name or name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif arguments is not None:  # some servers send the arguments as an object
            call.arguments.append(json.dumps(arguments))

    def target(self, index: int | None, call_id: str, name: str) -> PendingCall:
        """The call a delta belongs to: by index, else by id, else the last call."""
        if index is not None:
            current = self.at_index.get(index)
            if current is not None and not current.starts_new(call_id, name):
                return current
            return self.start(index)
        if call_id:
            known = next((call for call in self.calls if call.id == call_id), None)
            return known if known is not None else self.start(None)
        if self.calls and not self.calls[-1].starts_new("", name):
            return self.calls[-1]
        return self.start(None)

    def start(self, index: int | None) -> PendingCall:
        call = PendingCall(index)
        self.calls.append(call)
        if index is not None:
            self.at_index[index] = call
        return call

    def finished(self, seed: str) -> list[ToolCall]:
        """The complete calls in the order they began; ids made unique, arguments parsed."""
        result: list[ToolCall] = []
        seen: set[str] = set()
        for position, call in enumerate(self.calls):
            raw = "".join(call.arguments)
            if not (call.id or call.name or raw):
                continue  # an empty delta, not a call
            call_id = call.id or synthetic_id(seed, position, call.name, raw)
            while call_id in seen:  # a server that gave two calls one id
                call_id = f"{call_id}-{position}"
            seen.add(call_id)
            arguments, error = parse_arguments(raw)
            if not call.name:
                arguments, error = None, "the model called a tool without naming it"
            result.append(ToolCall(id=call_id, name=call.name, arguments=arguments, error=error))
        return result


def synthetic_id(seed: str, position: int, name: str, arguments: str) -> str:
    """The same call in the same round gets the same id; another round or other arguments another."""
    digest = hashlib.sha256(f"{seed}\0{position}\0{name}\0{arguments}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def parse_arguments(raw: str) -> tuple[dict[str, Any] | None, str]:
    """The arguments as an object, or None and why not. No arguments at all is ``{}``."""
    if not raw.strip():
        return {}, ""
    try:
        value = json.loads(raw)
    except ValueError as error:
        return None, f"the arguments are not valid JSON: {error}"
    if not isinstance(value, dict):
        return None, f"the arguments are not a JSON object but {type(value).__name__}: {raw[:80]}"
    return value, ""
