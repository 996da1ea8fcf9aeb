"""Which agent a person reaches, read directly: bounded creation and names no path can forge."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.services import account_ensure
from agents.models import Agent
from agents.selectors import agent_get
from tests.factories import Users

pytestmark = pytest.mark.django_db


def test_opening_new_names_stops_at_the_accounts_limit(settings: Any, users: Users) -> None:
    # given an account allowed three agents, with three already opened
    settings.AGENTS_MAX_AGENTS_PER_ACCOUNT = 3
    account_ensure(slug="acme", members=[users.alice, users.bob])
    opened = [agent_get(user=users.alice, kind="test.chat", name=f"a{i}") for i in range(3)]

    # then a fourth name is not found, and the three stay reachable, for bob too
    assert agent_get(user=users.alice, kind="test.chat", name="a3") is None
    assert [agent_get(user=users.bob, kind="test.chat", name=f"a{i}") for i in range(3)] == opened
    assert Agent.objects.count() == 3


def test_a_name_decoded_from_bytes_that_are_not_utf8_names_no_agent(users: Users) -> None:
    account_ensure(slug="acme", members=[users.alice])

    assert agent_get(user=users.alice, kind="test.chat", name="\ufffd\ufffd\ufffd") is None
    assert agent_get(user=users.alice, kind="test.chat", name="caf\ufffd") is None
    assert agent_get(user=users.alice, kind="test.chat", name="café") is not None
    assert not Agent.objects.filter(name__contains="\ufffd").exists()
