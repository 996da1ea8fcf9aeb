"""A provider for tests: each round's events come from a function of the request.

``ScriptedProvider(script)`` calls ``script(request)`` for the round's events and a delay, and
streams them with that delay before each one. Like the rules provider, a request with a
``prefix`` (a recovered round continuing) streams only the text after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from agents.providers.base import ModelEvent, ModelRequest, TextDelta

Script = Callable[[ModelRequest], tuple[list[ModelEvent], float]]


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script: Script) -> None:
        self.script = script

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        events, delay = self.script(request)
        skip = len(request.prefix)
        for event in events:
            if isinstance(event, TextDelta) and skip:
                if len(event.text) <= skip:
                    skip -= len(event.text)
                    continue
                event, skip = TextDelta(event.text[skip:]), 0
            if delay:
                time.sleep(delay)
            yield event
