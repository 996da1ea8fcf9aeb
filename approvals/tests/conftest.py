"""The cast of the approvals tests, on top of tests.fixtures' users.

- carol: staff, in the refund-approvers group (the reviewer)
- bob: in the group too, not staff (requests refunds: four eyes keeps him off his own)
- alice: the customer, in no group; mallory: another tenant
- dave: staff who may view every request but decides none
- erin: staff with approvals.decide_any, in no group
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User

from approvals.tests.support import GROUP

Cast = dict[str, User]


@pytest.fixture
def cast(users: dict[str, User]) -> Cast:
    group = Group.objects.create(name=GROUP)
    people: Cast = dict(users)
    people["carol"].groups.add(group)
    people["bob"].groups.add(group)
    people["dave"] = User.objects.create_user("dave", "dave@example.com", "pw-dave", is_staff=True)
    people["dave"].user_permissions.add(Permission.objects.get(codename="view_approvalrequest"))
    people["erin"] = User.objects.create_user("erin", "erin@example.com", "pw-erin", is_staff=True)
    people["erin"].user_permissions.add(Permission.objects.get(codename="decide_any"))
    return people
