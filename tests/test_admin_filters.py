"""A list filter in the admin's URL that the database cannot run is a 400 saying why, on every
model admin (config.admin.AdminSite), not a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.db import NotSupportedError, models
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


def test_a_lookup_this_database_lacks_is_a_400_and_other_errors_stay_errors(admin_user: Any) -> None:
    # SQLite has no JSON contains: the same answer (unit: a view that raises what the query would)
    site = AdminSite(name="probe")
    site.each_context = lambda request: {}  # type: ignore[method-assign]

    def refusing(request: Any) -> HttpResponse:
        raise NotSupportedError("contains lookup is not supported on this database backend.")

    view = site.admin_view(refusing)
    factory = RequestFactory()

    filtered = factory.get("/admin/webhooks/webhookdelivery/", {"body__contains": "x"})
    filtered.user = admin_user
    response = view(filtered)
    assert response.status_code == 400
    assert "contains lookup is not supported" in response.content.decode()

    # without a filter, or on a POST, it is a bug in the view: raised as it was
    for request in (factory.get("/admin/webhooks/webhookdelivery/"), factory.post("/admin/x/", {"a": "1"})):
        request.user = admin_user
        request._dont_enforce_csrf_checks = True  # type: ignore[attr-defined]
        with pytest.raises(NotSupportedError):
            view(request)
