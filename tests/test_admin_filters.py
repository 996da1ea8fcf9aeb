"""A list filter in the admin's URL that the database cannot run is a 400 saying why, on every
model admin (config.admin.AdminSite), not a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.db import NotSupportedError, OperationalError, connection, models
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import reverse

from config.admin import AdminSite


def probes(model: type[models.Model]) -> list[str]:
    """Filters on each field that PostgreSQL refuses when it runs them."""
    found = []
    for field in model._meta.concrete_fields:
        if isinstance(field, models.JSONField):
            found.append(f"{field.name}__a__regex=[")
        elif isinstance(field, (models.CharField, models.TextField)):
            found += [f"{field.name}__regex=[", f"{field.name}__iregex=("]
    return found


@pytest.mark.django_db(transaction=True)  # each refused query ends the transaction it ran in
def test_every_admin_list_answers_a_filter_the_database_refuses_with_a_400(client: Any, django_user_model: Any) -> None:
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    answers: dict[tuple[str, str], int] = {}
    tried = 0
    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for query in probes(model):
            tried += 1
            response = client.get(f"{url}?{query}")
            if response.status_code != 400:
                answers[url, query] = response.status_code
    assert tried > 100  # the project's admins and Django's own (users, groups) were all tried
    assert answers == {}


@pytest.mark.django_db(transaction=True)
def test_the_400_says_what_the_database_refused_and_links_to_the_list(client: Any, django_user_model: Any) -> None:
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    url = reverse("admin:auth_user_changelist")

    response = client.get(f"{url}?username__regex=[")

    assert response.status_code == 400
    page = response.content.decode()
    assert "This filter cannot be run" in page
    assert "invalid regular expression" in page
    assert f'href="{url}"' in page
    # and the list, unfiltered, still answers
    assert client.get(url).status_code == 200


def site_view(raised: Exception, *, name: str = "changelist_view") -> Any:
    """An admin view of a probe site, named ``name``, that raises what a list's query would."""
    site = AdminSite(name="probe")
    site.each_context = lambda request: {}  # type: ignore[method-assign]

    def view(request: Any) -> HttpResponse:
        raise raised

    view.__name__ = name
    return site.admin_view(view)


def asked(admin_user: Any, request: Any) -> Any:
    request.user = admin_user
    request._dont_enforce_csrf_checks = True
    return request


@pytest.mark.parametrize(
    "raised",
    [
        NotSupportedError("contains lookup is not supported on this database backend."),  # SQLite, JSON
        OverflowError("Python int too large to convert to SQLite INTEGER"),  # ?id__in=99999999999999999999
        ValueError("year 99999 is out of range"),  # ?date_joined__year__gt=99999
    ],
)
def test_what_other_databases_refuse_of_a_filter_is_a_400_too(admin_user: Any, raised: Exception) -> None:
    filtered = asked(admin_user, RequestFactory().get("/admin/webhooks/webhookdelivery/", {"body__contains": "x"}))
    response = site_view(raised)(filtered)
    assert response.status_code == 400
    assert str(raised) in response.content.decode()


def test_a_bad_sqlite_pattern_is_a_400_there_and_postgresqls_operational_error_stays_an_error(
    admin_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite's regular expressions are Python functions: a bad pattern fails as an OperationalError,
    # which on PostgreSQL means the database itself failed
    failed = OperationalError("user-defined function raised exception")
    request = asked(admin_user, RequestFactory().get("/admin/auth/user/", {"username__regex": "["}))
    with pytest.raises(OperationalError):
        site_view(failed)(request)
    monkeypatch.setattr(connection, "vendor", "sqlite")
    assert site_view(failed)(request).status_code == 400


def test_other_errors_stay_errors(admin_user: Any) -> None:
    # without a filter, on a POST, or in another view than a list, it is a bug: raised as it was
    factory = RequestFactory()
    refused = NotSupportedError("contains lookup is not supported on this database backend.")
    for view, request in (
        (site_view(refused), factory.get("/admin/webhooks/webhookdelivery/")),
        (site_view(refused), factory.post("/admin/x/", {"a": "1"})),
        (site_view(ValueError("a bug")), factory.post("/admin/x/?q=1", {"a": "1"})),
        (
            site_view(ValueError("a bug"), name="change_view"),
            factory.get("/admin/x/1/change/", {"_changelist_filters": "a"}),
        ),
    ):
        with pytest.raises((NotSupportedError, ValueError)):
            view(asked(admin_user, request))
