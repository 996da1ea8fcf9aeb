"""What ``manage.py seed_demo`` tells a person to do works: alice signs in where it says, with the
password it prints, and her home page shows the demo's run and assessment."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from examples.suppliers.demo import DEMO_SUPPLIER
from workflows.models import WorkflowRun


@pytest.mark.django_db
def test_seed_demo_says_where_alice_signs_in_and_that_is_where_she_can() -> None:
    # given the demo, seeded
    out = StringIO()
    call_command("seed_demo", stdout=out)
    printed = out.getvalue()
    run = WorkflowRun.objects.get(owner__username="alice", workflow="demo.onboarding")
    assert "alice  / alice" in printed
    assert "Sign in as alice at /accounts/login/" in printed and f"/runs/{run.id}/" in printed

    # when alice signs in there with the printed password
    client = Client()
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice"})

    # then she is home, with the demo run and the demo assessment, and may open the run's page
    assert response.status_code == 302 and response["Location"] == "/"
    home = re.sub(r"\s+", " ", client.get("/").content.decode())
    assert f'<a href="/runs/{run.id}/">' in home
    assert DEMO_SUPPLIER in home and "awaiting your input" in home
    assert client.get(f"/runs/{run.id}/").status_code == 200
