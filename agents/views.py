"""The chat page. Thin: authorise, read through a selector, render; the page then follows
``/ws/agents/<kind>/<name>/`` live (``agents/static/agents/chat.js``)."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from agents import selectors
from agents.consumers import max_text_chars


@login_required
def chat(request: HttpRequest, kind: str, name: str) -> HttpResponse:
    """The conversation with the agent ``kind``/``name`` of an account the user belongs to."""
    account = request.GET.get("account")
    try:
        agent = selectors.agent_get(user=request.user, kind=kind, name=name, account=account)
    except selectors.TooManyAgents as exc:
        return render(request, "agents/too_many.html", {"kind": kind, "name": name, "message": str(exc)}, status=409)
    if agent is None:
        # The same answer for another account's agent, an unknown account and an unknown kind.
        raise Http404("No such agent.")
    snapshot = selectors.agent_snapshot(agent=agent)
    query = f"?{urlencode({'account': agent.account.slug})}"
    context = {
        "agent": agent,
        "snapshot": snapshot,
        "ws_path": f"/ws/agents/{quote(kind, safe='')}/{quote(name, safe='')}/{query}",
        "max_text_chars": max_text_chars(),
    }
    return render(request, "agents/chat.html", context)
