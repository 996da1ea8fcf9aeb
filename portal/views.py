"""The signed-in person's pages. Thin: read through a selector, render. Sign in and out are
Django's own views (``portal.urls``), sign-in with its attempts limited (``accounts.signin``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.signin import SignInForm, answered_refused, device_cookie
from agents.selectors import agents_of
from portal.selectors import home_page


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Their refund requests and supplier assessments (where the examples are installed) and runs,
    in words, with links to each run."""
    return render(request, "home.html", {"home": home_page(user=request.user), "agents": agents_of(user=request.user)})


class SignInView(LoginView):
    """Django's sign-in page; too many failed attempts are refused for a while (429)."""

    authentication_form = SignInForm

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        device_cookie(self.request, response)
        return response

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        answered_refused(response, form)
        return response
