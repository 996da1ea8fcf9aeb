"""What the agents' tests share: an agent of alice's account, and reading a turn's stream back."""

from __future__ import annotations

from django.contrib.auth.models import User

from accounts.services import account_ensure
from agents.models import TURN_ENDED, Agent, Chunk, Turn
from agents.selectors import agent_get
from tests.support import wait_for


def chat_agent(user: User, *, kind: str = "test.chat", name: str = "t") -> Agent:
    account_ensure(slug="acme", members=[user])
    agent = agent_get(user=user, kind=kind, name=name)
    assert agent is not None
    return agent


def chunks(turn: Turn) -> list[Chunk]:
    return list(Chunk.objects.filter(turn=turn).order_by("seq"))


def streamed_text(turn: Turn) -> str:
    """The answer as a client shows it: text deltas, a ``data-reset`` dropping its round's text so
    far, rounds (separated by tool outputs) joined by a blank line."""
    rounds: list[str] = [""]
    for chunk in chunks(turn):
        if chunk.type == "text-delta":
            rounds[-1] += chunk.data["delta"]
        elif chunk.type == "data-reset":
            rounds[-1] = ""
        elif chunk.type == "tool-output-available":
            rounds.append("")
    return "\n\n".join(r for r in rounds if r)


def assert_seq_complete(turn: Turn) -> None:
    seqs = [c.seq for c in chunks(turn)]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


def wait_ended(turn: Turn, timeout: float = 30.0) -> Turn:
    def ended() -> Turn | None:
        fresh = Turn.objects.get(pk=turn.pk)
        return fresh if fresh.status in TURN_ENDED else None

    return wait_for(ended, timeout=timeout, what=f"turn {turn.number} to end")


def wait_status(turn: Turn, status: str, timeout: float = 30.0) -> Turn:
    def reached() -> Turn | None:
        fresh = Turn.objects.get(pk=turn.pk)
        return fresh if fresh.status == status else None

    return wait_for(reached, timeout=timeout, what=f"turn {turn.number} to be {status}")


def wait_chunks(turn: Turn, type_: str, n: int = 1, timeout: float = 30.0) -> None:
    wait_for(
        lambda: Chunk.objects.filter(turn=turn, type=type_).count() >= n,
        timeout=timeout,
        what=f"{n} {type_} chunks",
    )
