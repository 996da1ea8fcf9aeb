"""A list filter in the admin's URL that the database cannot run is a 400 saying why, on every
model admin (config.admin.AdminSite), not a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import Permission
from django.db import NotSupportedError, OperationalError, connection, models
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import reverse
from rest_framework.authtoken.models import Token

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


# --- credentials -------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_staff_member_who_may_view_users_cannot_filter_them_by_their_token(
    client: Any, django_user_model: Any
) -> None:
    # given a superuser with an API token, and a staff member who may only view users
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    key = Token.objects.create(user=root).key
    sam = django_user_model.objects.create_user("sam", password="pw", is_staff=True)
    sam.user_permissions.add(Permission.objects.get(codename="view_user"))
    client.force_login(sam)
    users = reverse("admin:auth_user_changelist")
    assert client.get(f"{users}?username=root").status_code == 200  # the list, filtered, is sam's to see

    # when sam filters the user list by the token, a character at a time or whole, or by the password
    for query in (
        f"auth_token__key__startswith={key[0]}",
        f"auth_token__startswith={key[0]}",
        f"auth_token={key}",
        f"auth_token__key__in={key}",
        f"auth_token__user__username=root&auth_token__key__gt={key[0]}",
        "password__startswith=pbkdf2",
    ):
        response = client.get(f"{users}?username=root&{query}")

        # then the list refuses the filter, whatever it would have kept
        assert response.status_code == 400, query
        assert b"root" not in response.content, query

    # and no action POSTed to a list so filtered runs on (or lists) what the filter keeps
    response = client.post(
        f"{users}?auth_token__key__startswith={key[0]}", {"action": "delete_selected", "select_across": "1"}
    )
    assert response.status_code == 400
    assert django_user_model.objects.filter(username="root").exists()


@pytest.mark.django_db
def test_no_admin_list_can_be_filtered_on_a_credential() -> None:
    from config.admin import reaches_a_credential

    # every model admin, each relation to a user or a token, one or two steps away
    found: list[str] = []
    for model in admin.site._registry:
        for field in model._meta.get_fields():
            related = field.related_model if field.is_relation else None
            if related is None:
                continue
            if issubclass(related, Token):
                found.append(f"{model.__name__}.{field.name}")
                assert reaches_a_credential(model, f"{field.name}__key__startswith")
                assert reaches_a_credential(model, field.name)
            if issubclass(related, AbstractBaseUser):
                found.append(f"{model.__name__}.{field.name}")
                assert reaches_a_credential(model, f"{field.name}__auth_token__key__startswith")
                assert reaches_a_credential(model, f"{field.name}__password__startswith")
                assert not reaches_a_credential(model, f"{field.name}__username__startswith")
    assert "User.auth_token" in found and len(found) > 10
    assert not reaches_a_credential(get_user_model(), "username__startswith")
    assert not reaches_a_credential(get_user_model(), "q")


# --- forms --------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_every_admin_form_that_edits_json_refuses_json_nested_too_deeply_as_a_field_error(
    django_user_model: Any,
) -> None:
    from django import forms

    from workflows.admin import JSONFormField

    request = RequestFactory().get("/admin/")
    request.user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    edited: list[str] = []
    for model, model_admin in admin.site._registry.items():
        form_fields = dict(model_admin.get_form(request).base_fields)
        for inline in model_admin.get_inline_instances(request):
            form_fields.update(inline.get_formset(request).form.base_fields)
        for name, field in form_fields.items():
            if isinstance(field, forms.JSONField):
                edited.append(f"{model._meta.label}.{name}")
                assert isinstance(field, JSONFormField), f"{model._meta.label}.{name}: use JSON_FORM_FIELDS"
    assert "schedules.Schedule.payload" in edited  # the check found what it is about
