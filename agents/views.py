"""The chat page. Thin: authorise, read through a selector, render; the page then follows
``/ws/agents/<kind>/<name>/`` live (``agents/static/agents/chat.js``)."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from agents import selectors
from agents.consumers import max_text_chars
from agents.forms import StartForm


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def chat(request: HttpRequest, kind: str, name: str) -> HttpResponse:
    """The conversation with the agent ``kind``/``name`` of an account the user belongs to.

    A GET never creates an agent: for a name that is not one yet the page asks, and its button (a
    POST, with the CSRF token) creates the agent and comes back here. Any site can link a signed-in
    user here (a top-level navigation carries the session cookie); only the user's own click opens
    a new agent in their account."""
    accounts = request.GET.getlist("account")
    if len(accounts) > 1:
        raise Http404("No such agent.")  # which one was meant? As for an account the user is not in
    account = accounts[0] if accounts else None
    create = request.method == "POST"
    try:
        agent = selectors.agent_get(user=request.user, kind=kind, name=name, account=account, create=create)
    except selectors.TooManyAgents as exc:
        return render(request, "agents/too_many.html", {"kind": kind, "name": name, "message": str(exc)}, status=409)
    if agent is None and not create:
        # Only where the user could open it: anyone else gets the same 404 as for an existing agent.
        where = selectors.agent_openable(user=request.user, kind=kind, name=name, account=account)
        if where is not None:
            return render(request, "agents/confirm_open.html", {"kind": kind, "name": name, "account": where})
    if agent is None:
        # The same answer for another account's agent, an unknown account and an unknown kind.
        raise Http404("No such agent.")
    if request.method == "POST":
        return HttpResponseRedirect(request.get_full_path(), status=303)
    snapshot = selectors.agent_snapshot(agent=agent)
    query = f"?{urlencode({'account': agent.account.slug})}"
    context = {
        "agent": agent,
        "snapshot": snapshot,
        "ws_path": f"/ws/agents/{quote(kind, safe='')}/{quote(name, safe='')}/{query}",
        "max_text_chars": max_text_chars(),
    }
    return render(request, "agents/chat.html", context)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def chat_start(request: HttpRequest) -> HttpResponse:
    """``/chat/``: start a conversation (or open one by its name again) with a kind of agent, in
    one of the user's accounts; the POST (with the CSRF token) creates the agent and sends the user
    to its page."""
    form = StartForm(request.POST if request.method == "POST" else None, user=request.user)  # type: ignore[arg-type]
    if form.is_valid():
        kind, name, account = (form.cleaned_data[field] for field in ("kind", "name", "account"))
        try:
            agent = selectors.agent_get(user=request.user, kind=kind, name=name, account=account)
        except selectors.TooManyAgents as exc:
            form.add_error(None, str(exc))
        else:
            if agent is None:  # a membership removed since the form was drawn
                form.add_error("account", "You are no longer a member of this account.")
            else:
                where = f"/chat/{quote(kind, safe='')}/{quote(name, safe='')}/?{urlencode({'account': account})}"
                return HttpResponseRedirect(where, status=303)
    return render(request, "agents/start.html", {"form": form}, status=400 if form.errors else 200)
