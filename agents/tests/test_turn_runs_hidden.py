"""A chat turn's run holds the conversation in its steps (the history its model read): it is seen
only by who may read the agents' turns (``agents.view_turn``), not by the member who sent the
message (who may leave the account), nor by staff who may read every run but not the chat."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from agents.services import message_send
from agents.tests.support import chat_agent
from tests.factories import Users, api_login, login, make_run
from tests.fixtures import NoEnqueue
from workflows.selectors import hidden_workflows, run_get, run_list

pytestmark = pytest.mark.django_db


def test_a_turns_run_is_hidden_from_its_owner_and_from_staff_without_the_agents_permission(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given alice's chat message, whose turn's run she owns, and a run of hers of another workflow
    turn = message_send(agent=chat_agent(users.alice), user=users.alice, text="my card ends 4242")
    assert turn.run is not None
    run_id = str(turn.run.pk)
    own = make_run(owner=users.alice)

    # then neither she nor dave (who may view every run) sees the turn's run, by any way in
    for user in (users.alice, users.dave):
        client = api_login(user)
        assert client.get(f"/api/runs/{run_id}").status_code == 404
        assert client.get("/api/runs", {"workflow": "agents.turn"}).json()["results"] == []
        assert login(user).get(f"/runs/{run_id}/").status_code == 404
        assert run_get(user=user, run_id=run_id) is None
    assert [r["id"] for r in api_login(users.alice).get("/api/runs").json()["results"]] == [str(own.pk)]
    admin_page = reverse("admin:workflows_workflowrun_change", args=[run_id])
    assert login(users.dave).get(admin_page).status_code == 302  # the admin's "not found": back to the list
    assert run_id not in login(users.dave).get(reverse("admin:workflows_workflowrun_changelist")).content.decode()

    # when dave may also read the agents' turns, he sees it as any run
    users.dave.user_permissions.add(Permission.objects.get(codename="view_turn"))
    dave = type(users.dave).objects.get(pk=users.dave.pk)  # permissions are cached on the instance
    assert hidden_workflows(dave) == ["agents.fiber"]
    assert api_login(dave).get(f"/api/runs/{run_id}").status_code == 200
    assert login(dave).get(admin_page).status_code == 200
    assert run_list(user=dave).filter(pk=run_id).exists()
