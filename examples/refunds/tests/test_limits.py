"""A customer asking for a penny at a time must not fill the workers and the provider: past
REFUND_MAX_OPEN_REQUESTS requests in progress, a 429 that creates nothing."""

from __future__ import annotations

from typing import Any

import pytest

from examples.refunds.apis import AMOUNT_FORM
from examples.refunds.models import RefundRequest
from examples.refunds.services import order_create
from tests.factories import Users, api_login
from workflows.services import run_terminate


@pytest.mark.django_db
def test_past_the_open_requests_limit_a_refund_request_is_a_429_and_creates_nothing(
    users: Users, settings: Any
) -> None:
    settings.REFUND_MAX_OPEN_REQUESTS = 2
    mallory = users.mallory
    order_create(number="9200", customer=mallory, amount="10.00")
    client = api_login(mallory, via="session")  # request.user is Django's lazy user, as in the browser

    def ask() -> Any:
        return client.post("/api/orders/9200/refunds", {"amount": "0.01"}, format="json")

    assert [ask().status_code, ask().status_code] == [201, 201]
    refused = ask()

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_requests"
    assert "you have 2 refund requests in progress (the limit is 2)" in refused.json()["error"]["message"]
    assert RefundRequest.objects.filter(customer=mallory).count() == 2
    # once one is handled (its run ended), she may ask again; other customers were never limited
    handled = RefundRequest.objects.filter(customer=mallory).first()
    assert handled is not None and handled.run_id is not None
    run_terminate(run_id=handled.run_id)
    assert ask().status_code == 201


@pytest.mark.parametrize(
    "amount", ["0", "0.00", "-1", "1.001", "abc", "1e2", "99999999999.99", " 5", "", 5, 1.5, None, True, ["1"]]
)
def test_an_amount_of_the_wrong_form_is_a_400_that_says_what_an_amount_is(users: Users, amount: Any) -> None:
    order_create(number="9300", customer=users.alice, amount="50.00")

    response = api_login(users.alice, via="force").post("/api/orders/9300/refunds", {"amount": amount}, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["detail"] == {"amount": [AMOUNT_FORM]}
    assert AMOUNT_FORM.startswith("An amount in the order's currency, as a string of digits: more than 0,")
    assert not RefundRequest.objects.exists()
