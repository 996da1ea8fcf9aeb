"""The signed-in person's pages. Thin: read through a selector, render. Sign in and out are
Django's own views (``portal.urls``)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from agents.selectors import agents_of
from portal.selectors import home_page


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Their refund requests and supplier assessments (where the examples are installed) and runs,
    in words, with links to each run."""
    return render(request, "home.html", {"home": home_page(user=request.user), "agents": agents_of(user=request.user)})
