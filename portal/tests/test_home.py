"""The home page ``/``: the signed-in person's refund requests, supplier assessments and runs, in
words and with links to their runs, newest first, bounded; never anyone else's."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from examples.refunds.models import RefundRequest
from examples.refunds.services import order_create, refund_request_create
from examples.suppliers.services import assessment_create
from portal.selectors import HOME_LIMIT
from tests.factories import Users, login
from workflows.models import RunStatus, WorkflowRun


def home_of(user: User) -> str:
    response = login(user).get("/")
    assert response.status_code == 200
    return response.content.decode()


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def refund_for(customer: User, number: str, amount: str = "40.00") -> RefundRequest:
    """A refund request through the service. Inside the test's transaction its run's enqueue never
    leaves (on commit), so the request stays "being prepared" and no worker is needed."""
    order = order_create(
        number=number,
        customer=customer,
        amount="300.00",
        items=[{"sku": "MUG", "qty": 1}],
        shipping_address={"street": "1 Test Lane", "postcode": "AB1 2CD"},
    )
    request, _ = refund_request_create(order=order, customer=customer, amount=amount, reason="broken")
    return request


@pytest.mark.django_db
def test_home_lists_the_customers_refunds_assessments_and_runs_in_words_with_links(users: Users) -> None:
    # given alice's refund (its run queued), an assessment awaiting her input, and a run of hers
    alice = users.alice
    refund = refund_for(alice, "5001", "40.00")
    assessment = assessment_create(supplier_name="Acme Metals", requested_by=alice, sources={"credit": {"score": 7}})
    run = WorkflowRun.objects.create(workflow="demo.onboarding", owner=alice, status=RunStatus.WAITING)

    # when she opens her home page
    html = home_of(alice)
    text = text_of(html)

    # then each is there, in words, linked to its run
    assert "Your refund requests order amount status asked progress 5001 £40.00 being prepared" in text
    assert f'<a href="/runs/{refund.run_id}/">Follow the refund on order 5001</a>' in html
    assert "Acme Metals awaiting your input" in text
    assert f'data-assessment="{assessment.pk}"' in html and "not started" in text  # no run until she submits
    assert f'<a href="/runs/{run.id}/">' in html and "demo.onboarding waiting" in text
    assert f'<a href="/runs/{refund.run_id}/">Run' in html  # the refund's run is one of her runs too


@pytest.mark.django_db
def test_home_never_shows_another_customers_things(users: Users) -> None:
    # given mallory's refund, assessment and run, and alice's
    alice, mallory = users.alice, users.mallory
    hers = refund_for(mallory, "6660", "66.60")
    assessment_create(supplier_name="Mallory Shell Co", requested_by=mallory)
    theirs = WorkflowRun.objects.create(workflow="demo.onboarding", owner=mallory, status=RunStatus.COMPLETED)
    alices = refund_for(alice, "5002")

    # when alice opens her home page
    html = home_of(alice)

    # then she sees none of mallory's
    assert "6660" not in html and "66.60" not in html and "Mallory Shell Co" not in html
    assert str(hers.run_id) not in html and str(theirs.id) not in html
    assert str(alices.run_id) in html
    # and mallory sees hers, not alice's
    mallorys = home_of(mallory)
    assert "6660" in mallorys and "Mallory Shell Co" in mallorys and "5002" not in mallorys


@pytest.mark.django_db
def test_staff_home_lists_their_own_runs_not_everyones(users: Users) -> None:
    # carol may view every run (the admin and the API show them), but her home page is hers
    alices = WorkflowRun.objects.create(workflow="test.echo", owner=users.alice, status=RunStatus.COMPLETED)
    carols = WorkflowRun.objects.create(workflow="test.echo", owner=users.carol, status=RunStatus.COMPLETED)

    html = home_of(users.carol)

    assert str(carols.id) in html and str(alices.id) not in html


@pytest.mark.django_db
def test_home_shows_the_newest_runs_first_bounded_and_says_how_many_there_are(users: Users) -> None:
    alice = users.alice
    runs = [
        WorkflowRun.objects.create(workflow=f"test.n{i}", owner=alice, status=RunStatus.COMPLETED)
        for i in range(HOME_LIMIT + 5)
    ]

    html = home_of(alice)

    shown = re.findall(r'<tr class="run" data-run="([0-9a-f-]+)">', html)
    assert shown == [str(r.id) for r in reversed(runs)][:HOME_LIMIT]
    assert f"The newest {HOME_LIMIT} of {HOME_LIMIT + 5}." in html


@pytest.mark.django_db
def test_a_new_customer_is_told_there_is_nothing_yet(users: Users) -> None:
    text = text_of(home_of(users.bob))

    assert "You have not asked for a refund." in text
    assert "You have not asked for a supplier assessment." in text
    assert "You have no workflow runs." in text


@pytest.mark.django_db
def test_the_home_page_reads_a_bounded_number_of_rows(
    users: Users, settings: Any, django_assert_max_num_queries: Any
) -> None:
    # given more of everything than the page shows (more refunds in progress than a customer may
    # have by default, hence no limit here)
    settings.REFUND_MAX_OPEN_REQUESTS = 0
    alice = users.alice
    for i in range(HOME_LIMIT + 2):
        refund_for(alice, f"70{i:02d}")
    client = login(alice)

    # then the page costs a few queries per row shown, whatever there is beyond
    with django_assert_max_num_queries(10 + 3 * HOME_LIMIT):
        assert client.get("/").status_code == 200
