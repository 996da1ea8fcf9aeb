"""The approvals tests' cast: the suite's ``users``, with carol and bob in the refund approvers'
group. bob asks for most requests here, so four eyes keeps him off them; dave sees every request
and decides none; erin decides any (approvals.decide_any) without being in the group."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from approvals.tests.support import GROUP
from tests.factories import Users


@pytest.fixture
def users(users: Users) -> Users:
    Group.objects.create(name=GROUP).user_set.add(users.carol, users.bob)
    return users
