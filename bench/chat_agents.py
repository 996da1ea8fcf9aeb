"""What bench/chat.py's worker and daphne load (``AGENTS_MODULES=bench.chat_agents``): the agent
``bench.chat``, whose model is a script read from the customer's last message.

- ``paced <n> <interval>``: ``n`` text deltas, one every ``interval`` seconds on a fixed schedule
  (a model streaming at a steady rate);
- ``fast <n>``: ``n`` text deltas as fast as the model step takes them;
- ``instant``: one text delta, no wait (a model that costs nothing);
- ``hold <n>``: ``n`` text deltas as fast as it can, then one every half second until the turn is
  stopped (a long answer still streaming, for clients to reconnect to).

Every delta is ``"<i>:<t> "``: its number (1, 2, …) and ``time.time()`` just before the provider
yields it, so a client that receives it knows how long it took from the model step to its socket.
A recovered round (``ModelRequest.prefix``: the deltas already stored) continues with the next
number, so a complete answer is 1..n once each, whatever crashed in between.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from agents.providers.base import Finish, ModelEvent, ModelRequest, Provider, TextDelta
from agents.registry import ChatAgent, agent

KIND = "bench.chat"


def delta(i: int) -> TextDelta:
    return TextDelta(f"{i}:{time.time():.6f} ")


class PacedProvider:
    """The bench's model: the script named by the last user message (see the module's docstring)."""

    name = "bench"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        users = [m for m in request.messages if m.role == "user"]
        words = users[-1].content.split() if users else []
        command = words[0] if words else "instant"
        done = request.prefix.count(" ")  # deltas stored before an interruption: each ends with one space
        if command == "instant":
            if not done:
                yield delta(1)
        elif command == "fast":
            for i in range(done + 1, int(words[1]) + 1):
                yield delta(i)
        elif command == "hold":
            for i in range(done + 1, int(words[1]) + 1):
                yield delta(i)
            i = max(done, int(words[1]))
            while True:  # until a stop fences this step out at its next write
                time.sleep(0.5)
                i += 1
                yield delta(i)
        elif command == "paced":
            n, interval = int(words[1]), float(words[2])
            start = time.monotonic()
            for k, i in enumerate(range(done + 1, n + 1)):
                wait = start + k * interval - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                yield delta(i)
        else:
            raise ValueError(f"bench.chat: unknown script {command!r}")
        yield Finish("stop")


@agent(KIND)
class BenchChat(ChatAgent):
    model = "bench"
    system_prompt = "A benchmark's model: it streams numbered, timestamped deltas."

    def provider(self) -> Provider:
        return PacedProvider()
