"""The environment the tests give the processes they start reaches the same database."""

from __future__ import annotations

import dj_database_url
import pytest
from django.db import connections

from tests.support import database_url, service_env


@pytest.mark.parametrize(
    ("host", "password"),
    [("/var/run/postgresql", ""), ("127.0.0.1", "p@ss:w/rd%")],
    ids=["a socket directory", "a password with URL characters"],
)
def test_a_started_process_is_given_the_test_database_as_it_is(
    monkeypatch: pytest.MonkeyPatch, host: str, password: str
) -> None:
    default = connections["default"]  # the wrapper itself: the proxy's attributes are not its own
    settings = {**default.settings_dict, "HOST": host, "PASSWORD": password, "PORT": "5433"}
    monkeypatch.setattr(default, "settings_dict", settings)

    parsed = dj_database_url.parse(service_env()["DATABASE_URL"])

    assert (parsed["HOST"], parsed["PASSWORD"], parsed["PORT"], parsed["NAME"]) == (
        host,
        password,
        5433,
        settings["NAME"],
    )
    # and another database of the same server, as the run command's test makes one
    assert dj_database_url.parse(database_url(settings, "another"))["NAME"] == "another"
