"""The project's admin site: Django's, with a list filter the database cannot run a 400 that says so,
and its sign-in's failed attempts (and its change of one's password's checks of the old one) limited
as the portal's sign-in's (``accounts.signin``).

The admin lets a list be filtered by any lookup on the model's own fields from the URL
(``?username__regex=[``, ``?body__contains=x``). Django checks the lookup's name, not whether the
database can run it: an invalid regular expression (PostgreSQL) or a JSON ``contains`` (SQLite)
failed the list's query, a 500 and a traceback in the log for a typo in an address bar. Here the
list answers 400 with the reason and a link to the list unfiltered. Only a list's GET with a query
string is answered so: any other such error is a bug, and stays a 500.

A list may not be filtered on a credential (``reaches_a_credential``): an API token's key, a
user's password hash; nor on a field its model admin names in ``unfilterable_fields``: one it
shows only redacted, or not at all. A filter tells which rows it keeps, so it would read a value
the list never shows out a character at a time. Such a filter is a 400, as Django answers a lookup
it refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.views import PasswordChangeView
from django.core.exceptions import FieldDoesNotExist
from django.db import DataError, NotSupportedError, OperationalError, connection
from django.db.models import Model
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse
from rest_framework.authtoken.models import Token

from accounts.signin import AdminSignInForm, PasswordChangeForm, answered_refused, device_cookie

# What a filter in the URL can make a list's query raise: a value the database cannot read (an invalid
# regular expression), a lookup it does not have, a number or a year Python or SQLite cannot hold
# (``?id__in=99999999999999999999``, ``?date_joined__year__gt=99999``), and, on SQLite, whose
# regular expressions are Python functions, a pattern that fails in one ("user-defined function
# raised exception").
FILTER_ERRORS = (DataError, NotSupportedError, OverflowError, ValueError, OperationalError)

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class AdminSite(admin.AdminSite):
    login_form = AdminSignInForm  # Django's, with failed attempts counted and limited (accounts.signin)

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().login(request, extra_context)
        answered_refused(response, (getattr(response, "context_data", None) or {}).get("form"))
        device_cookie(request, response)
        return response

    def password_change(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        """Django's, with the old password's checks counted as sign-ins (``accounts.signin``)."""
        defaults: dict[str, Any] = {
            "form_class": PasswordChangeForm,
            "success_url": reverse("admin:password_change_done", current_app=self.name),
            "extra_context": {**self.each_context(request), **(extra_context or {})},
        }
        if self.password_change_template is not None:
            defaults["template_name"] = self.password_change_template
        request.current_app = self.name
        # as Django's own: the form, or a redirect once changed (the stubs say a TemplateResponse)
        return cast(TemplateResponse, LimitedPasswordChangeView.as_view(**defaults)(request))

    def admin_view(self, view: View, cacheable: bool = False) -> View:
        if getattr(view, "__name__", "") != "changelist_view":
            return super().admin_view(view, cacheable)  # only a list reads filters from its URL
        model_admin = getattr(view, "__self__", None)
        model = getattr(model_admin, "model", None)
        hidden = frozenset(getattr(model_admin, "unfilterable_fields", ()))

        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            # After the site's own checks (a visitor signed out is sent to sign in, not told 400).
            # Any method: an action POSTed to a filtered list acts on (and its confirmation lists)
            # the rows the filter keeps.
            if model is not None:
                for lookup in request.GET:
                    if lookup.split(LOOKUP_SEP, 1)[0] in hidden or reaches_a_credential(model, lookup):
                        raise DisallowedModelAdminLookup(f"Filtering by {lookup} not allowed")
            return view(request, *args, **kwargs)

        checked = super().admin_view(cast(View, guarded), cacheable)

        @wraps(checked)
        def answered(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            try:
                return checked(request, *args, **kwargs)
            except FILTER_ERRORS as exc:
                if not _a_refused_filter(request, exc):
                    raise
                return self.bad_filter(request, exc)

        return cast(View, answered)

    def bad_filter(self, request: HttpRequest, exc: Exception) -> TemplateResponse:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        context = {**self.each_context(request), "title": "This filter cannot be run", "reason": reason}
        response = TemplateResponse(request, "admin/bad_filter.html", context, status=400)
        response.render()  # here, so that a problem in the template is this view's, not the handler's
        return response


def reaches_a_credential(model: type[Model], lookup: str) -> bool:
    """Whether a list of ``model`` filtered by ``lookup`` (from its URL) would be filtered on a
    credential: an API token's key, or a user's password hash.

    A list tells which rows a filter keeps, so a filter on a value it never shows reads the value
    out a character at a time (``?auth_token__key__startswith=5c``). Django's admin refuses
    lookups that reach through two relations, and its user admin a filter on the password; but it
    lets the user list be filtered by ``auth_token``, one relation away: a token's key is its
    primary key, which Django takes for a field of the user's own. Anyone with the view permission
    on users could read any user's token, a superuser's too, and act as them."""
    for part in lookup.split(LOOKUP_SEP):
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            return False  # a transform (startswith) or a parameter of the list's own (q, o, p)
        related = field.related_model if field.is_relation else None
        if isinstance(related, type) and issubclass(related, Token):
            return True  # the relation's value is the token's key
        if issubclass(model, Token) and field.name == "key":
            return True
        if issubclass(model, AbstractBaseUser) and field.name == "password":
            return True
        if not isinstance(related, type):
            return False
        model = related
    return False


class LimitedPasswordChangeView(PasswordChangeView):
    def get_form_kwargs(self) -> dict[str, Any]:
        return {**super().get_form_kwargs(), "request": self.request}

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        answered_refused(response, form)
        return response


def _a_refused_filter(request: HttpRequest, exc: Exception) -> bool:
    """Whether ``exc``, raised by a list, is its filter refused: asked for with a query string.
    Anything else (a POST, an OperationalError of PostgreSQL: the database itself failing) is not a
    filter's fault, and stays a 500."""
    if request.method != "GET" or not request.GET:
        return False
    return not isinstance(exc, OperationalError) or connection.vendor == "sqlite"
