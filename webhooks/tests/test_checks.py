"""The system check refuses a bad source configuration with a message that says what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from webhooks.checks import check_sources
from webhooks.conf import sources

SECRET = "a-secret-of-at-least-sixteen-bytes"
GOOD = {"scheme": "github", "secrets": [SECRET], "action": {"type": "operation_outcome", "system": "payments"}}


def messages(settings: Any, **source: Any) -> list[str]:
    settings.WEBHOOK_SOURCES = {"acme": {**GOOD, **source}}
    return [f"{m.id}: {m.msg}" for m in check_sources()]


def test_the_default_settings_pass() -> None:
    assert [m for m in check_sources() if m.level >= 40] == []


def test_a_good_source_passes_and_is_served(settings: Any) -> None:
    assert messages(settings) == []
    assert set(sources()) == {"acme"}
    assert SECRET not in repr(sources()["acme"])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"scheme": "paypal"}, "scheme must be one of github, standard, stripe"),
        ({"secrets": "one"}, "secrets must be a list"),
        ({"secrets": ["short"]}, "secret #1 is 5 bytes; at least 16"),
        ({"secrets": [SECRET, "whsec_!!"]}, "secret #2: a whsec_ secret must be base64"),
        ({"tolerance_seconds": 0}, "tolerance_seconds must be a whole number from 1 to 3600"),
        ({"max_body_bytes": "big"}, "max_body_bytes must be a whole number"),
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"action": {"type": "email"}}, "action must be an object whose type is one of"),
        ({"action": {"type": "workflow", "workflow": "no.such"}}, "no workflow 'no.such' is registered"),
        (
            {"action": {"type": "workflow", "workflow": "agents.fiber"}},
            "workflow 'agents.fiber' is started only by its own app (agents.fibers), for what it made: not by a",
        ),
        ({"action": {"type": "operation_outcome"}}, "names the ledger system"),
        (
            {"action": {"type": "submission", "kind": "test.chat", "name": "n", "text_from": "text"}},
            "names the agent's account",
        ),
        (
            {"action": {"type": "submission", "account": "a", "kind": "nope", "name": "n", "text_from": "text"}},
            "no agent kind 'nope' is registered",
        ),
        (
            {"action": {"type": "submission", "account": "a", "kind": "test.chat", "name": "n/m", "text_from": ""}},
            "the agent's name must be 1 to",
        ),
        (
            {"action": {"type": "submission", "account": "a", "kind": "test.chat", "name": "n", "text_from": 1}},
            "text_from must be a dotted path",
        ),
    ],
)
def test_a_bad_source_is_an_error_saying_what(settings: Any, change: dict[str, Any], says: str) -> None:
    found = messages(settings, **change)
    assert len(found) == 1 and found[0].startswith("webhooks.E001: webhook source 'acme': "), found
    assert says in found[0]
    assert sources() == {}  # and the endpoint does not serve it


def test_a_bad_name_is_an_error(settings: Any) -> None:
    settings.WEBHOOK_SOURCES = {"Acme/Pay": GOOD}
    assert [m.id for m in check_sources()] == ["webhooks.E001"]


def test_a_source_named_schedule_is_refused_so_its_events_never_pass_for_a_schedules_firings(settings: Any) -> None:
    # its event "nightly:<time>" would be keyed schedule:nightly:<time>, as that firing's work is
    settings.WEBHOOK_SOURCES = {"schedule": GOOD}
    found = [f"{m.id}: {m.msg}" for m in check_sources()]
    assert len(found) == 1 and found[0].startswith("webhooks.E001: webhook source 'schedule': "), found
    assert "reserved" in found[0]
    assert sources() == {}


def test_a_source_without_secrets_is_a_warning(settings: Any) -> None:
    assert [m.split(":")[0] for m in messages(settings, secrets=[])] == ["webhooks.W001"]


def test_two_sources_sharing_a_secret_is_a_warning_that_names_them(settings: Any) -> None:
    other = "another-secret-of-sixteen-bytes"
    settings.WEBHOOK_SOURCES = {
        "acme": GOOD,
        "hub": {**GOOD, "secrets": [other, SECRET]},
        "own": {**GOOD, "secrets": [other + "!"]},
    }

    [warning] = check_sources()

    assert warning.id == "webhooks.W002" and warning.msg.startswith("webhook sources 'acme', 'hub' share a secret")
    assert SECRET not in warning.msg and SECRET not in str(warning.hint)


def test_a_workflow_action_naming_a_registered_workflow_passes(settings: Any) -> None:
    assert messages(settings, action={"type": "workflow", "workflow": "test.echo", "payload_from": "data"}) == []


def test_a_source_accepting_more_than_the_server_does_is_an_error(settings: Any) -> None:
    # given a server that refuses bodies over 1 MiB before any view reads them
    settings.HTTP_MAX_BODY_BYTES = 1024 * 1024

    # then a source that says it takes 2 MiB says what it would never see
    [found] = messages(settings, max_body_bytes=2 * 1024 * 1024)
    assert "max_body_bytes is more than HTTP_MAX_BODY_BYTES (1048576)" in found
    assert messages(settings, max_body_bytes=1024 * 1024) == []
