"""How the examples' processes tell the customer's chat where their requests stand.

A process started from a chat (a refund asked for with the support agent's tool) or for a customer
who has an account agent (a supplier assessment) keeps one entry per request in a section of that
agent's state, in words::

    {"refunds": {"17": {"order": "1042", "amount": "150.00", "currency": "GBP", "status": "confirmed"}}}

Each change is written by an atomic step (``tell_chat``), so a replay or a recovered worker never
tells it twice, and its commit pushes ``agent.state`` to the agent's clients (the chat page lists
the entries under "Your requests").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from workflows.engine import Step

# The customer's support agent (examples/demo/agents.py registers this kind).
SUPPORT_KIND = "support"


def chat_report(agent_id: int, section: str, key: str, entry: dict[str, Any]) -> int | None:
    """Set ``state[section][key] = entry`` in the agent's state: its new version, or None when the
    agent no longer exists (nobody is left to tell).

    Run as an atomic step: the agent's row is locked to the step's commit, so two processes telling
    one agent at once each keep the other's entry (``agent_state_merge`` merges top-level keys only,
    so the section is read and written whole under that lock)."""
    from agents.models import Agent
    from agents.services import agent_state_merge

    assert transaction.get_connection().in_atomic_block, "run as an atomic step"
    state = Agent.objects.select_for_update().filter(pk=agent_id).values_list("state", flat=True).first()
    if state is None:
        return None
    current = state.get(section) if isinstance(state, dict) else None
    entries = dict(current) if isinstance(current, dict) else {}
    entries[key] = entry
    return agent_state_merge(agent_id=agent_id, patch={section: entries})


def tell_chat(step: Step, agent_id: int | None, section: str, key: str, entry: dict[str, Any]) -> None:
    """Tell the agent (if the run has one) the entry's new status, once: an atomic step named after
    the status, taken only by runs that name an agent, so runs without one replay as before."""
    if agent_id is None:
        return
    step.do(f"tell the chat: {entry['status']}", chat_report, agent_id, section, key, entry, atomic=True)


def agent_of(payload: dict[str, Any]) -> int | None:
    """The agent a run reports to: the payload's ``"agent"`` (an id), or None."""
    value = payload.get("agent")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def account_agent(user: User) -> int | None:
    """The agent that hears about a process ``user`` started outside a chat (a supplier assessment):
    the oldest support agent of their default account, or None if it has none (none is created:
    a customer who never chatted has nobody to tell)."""
    from accounts.selectors import account_for
    from agents.models import Agent

    account = account_for(user)
    if account is None:
        return None
    agents = Agent.objects.filter(account=account, kind=SUPPORT_KIND).order_by("created_at", "pk")
    found: int | None = agents.values_list("pk", flat=True).first()
    return found
