"""A project without the examples (``INSTALL_EXAMPLES`` off, the default): it passes its checks,
migrates a fresh database without the examples' tables, and serves the engine, its API and the
home page, the examples' routes being the API's 404. Each step runs in a process of its own with
the examples off, as a production deployment's would, on a database of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dj_database_url
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_APPS = ("demo", "refunds", "suppliers")  # the examples' app labels
EXAMPLE_WORKFLOWS = ("demo.onboarding", "refund", "supplier-assessment")


def database_url() -> str:
    """A database of this module's own, beside the session's test database."""
    url = dj_database_url.parse(os.environ["DATABASE_URL"])
    return (
        f"postgres://{url['USER'] or 'postgres'}@{url['HOST'] or '127.0.0.1'}:{url['PORT'] or 5432}/"
        f"test_{url['NAME']}_without_examples"[:63]
    )


def without_examples(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``args`` run with the examples off and only the project's own workflow modules."""
    base = {key: value for key, value in os.environ.items() if key not in ("INSTALL_EXAMPLES", "WORKFLOWS_MODULES")}
    return subprocess.run(
        list(args),
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), "DATABASE_URL": database_url(), **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return without_examples(sys.executable, "manage.py", *args, **env)


def recreate(url: str, *, drop_only: bool = False) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def query(sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(database_url()) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture(scope="module")
def migrated() -> Iterator[subprocess.CompletedProcess[str]]:
    """A fresh database migrated by a process without the examples; dropped afterwards."""
    recreate(database_url())
    result = manage("migrate", "--noinput")
    yield result
    recreate(database_url(), drop_only=True)


def test_the_checks_pass_without_the_examples(migrated: subprocess.CompletedProcess[str]) -> None:
    # a production project's checks, with HTTPS as it would run: no errors
    check = manage("check", "--deploy", HTTPS="1")
    assert check.returncode == 0, check.stderr
    # and no core app's models need a migration the examples would make (none depends on them)
    missing = manage("makemigrations", "--check", "--dry-run")
    assert missing.returncode == 0, missing.stdout + missing.stderr
    assert missing.stdout.strip() == "No changes detected"


def test_a_fresh_database_migrates_without_the_examples_tables(migrated: subprocess.CompletedProcess[str]) -> None:
    assert migrated.returncode == 0, migrated.stderr

    tables = {name for (name,) in query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    applied = {app for (app,) in query("SELECT DISTINCT app FROM django_migrations")}
    assert {"workflows_workflowrun", "ledger_externaloperation", "approvals_approvalrequest"} <= tables
    assert {"workflows", "ledger", "approvals"} <= applied
    assert not [table for table in tables if table.startswith(tuple(f"{app}_" for app in EXAMPLE_APPS))]
    assert not applied & set(EXAMPLE_APPS)
    content_types = {app for (app,) in query("SELECT DISTINCT app_label FROM django_content_type")}
    assert not content_types & set(EXAMPLE_APPS)


def served_without_examples() -> None:
    """Run in a process without the examples, on the migrated database: what it serves, as JSON."""
    import django

    django.setup()
    from django.apps import apps
    from django.contrib.auth import get_user_model
    from django.core.management import get_commands
    from django.test.utils import setup_test_environment

    from tests.factories import login
    from workflows.registry import workflow_names

    setup_test_environment()  # the test client's host
    user_model = get_user_model()
    erin = user_model.objects.create_user("erin")
    admin = user_model.objects.create_superuser("admin", email="admin@example.com")
    client, staff = login(erin), login(admin)

    def api(method: str, path: str, body: dict[str, Any] | None = None) -> list[Any]:
        response = getattr(client, method)(path, body or {}, content_type="application/json")
        return [response.status_code, response.json()["error"]["code"] if response.status_code >= 400 else None]

    home = client.get("/")
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    admin_index = staff.get("/admin/")
    print(
        json.dumps(
            {
                "installed": [app for app in EXAMPLE_APPS if apps.is_installed(f"examples.{app}")],
                "workflows": workflow_names(),
                "seed_demo": "seed_demo" in get_commands(),
                "home": [home.status_code, home.content.decode()],
                "schema_paths": sorted(schema.json()["paths"]),
                "admin": [admin_index.status_code, admin_index.content.decode()],
                "admin_orders": staff.get("/admin/refunds/order/").status_code,
                "runs": api("get", "/api/runs"),
                "approvals": api("get", "/api/approvals"),
                "refund_create": api("post", "/api/orders/1042/refunds", {"amount": "1.00", "reason": "x"}),
                "refund_get": api("get", "/api/refunds/1"),
                "assessments": api("get", "/api/assessments"),
                "assessment_create": api("post", "/api/assessments", {"supplier_name": "x", "sources": {}}),
                "demo_start": api("post", "/api/workflows/demo.onboarding/runs", {"payload": {}}),
            }
        )
    )


def test_a_project_without_the_examples_serves_the_engine_and_404s_their_routes(
    migrated: subprocess.CompletedProcess[str],
) -> None:
    # given a database migrated without the examples
    assert migrated.returncode == 0, migrated.stderr

    # when a process without them serves a signed-in person and a superuser
    code = f"from tests.test_without_examples import {served_without_examples.__name__} as f; f()"
    result = without_examples(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    served = json.loads(result.stdout.strip().splitlines()[-1])

    # then none of the examples is installed, nor their workflows or their demo command
    assert served["installed"] == []
    assert not set(served["workflows"]) & set(EXAMPLE_WORKFLOWS)
    assert served["seed_demo"] is False
    # and the home page lists the person's runs, without the examples' sections
    status, html = served["home"]
    assert status == 200
    assert "Your workflow runs" in html
    assert "refund" not in html.lower() and "assessment" not in html.lower()
    # and the engine's API answers, its schema without the examples' operations
    assert served["runs"] == [200, None]
    assert served["approvals"] == [200, None]
    assert "/api/runs" in served["schema_paths"]
    assert not [p for p in served["schema_paths"] if p.startswith(("/api/orders", "/api/refunds", "/api/assessments"))]
    # and the examples' routes are the API's JSON 404, their workflows unknown
    for route in ("refund_create", "refund_get", "assessments", "assessment_create"):
        assert served[route] == [404, "not_found"], route
    assert served["demo_start"] == [404, "unknown_workflow"]
    # and the admin has no pages of theirs
    status, html = served["admin"]
    assert status == 200
    assert "/admin/workflows/workflowrun/" in html
    assert "/admin/refunds/" not in html and "/admin/suppliers/" not in html
    assert served["admin_orders"] == 404
