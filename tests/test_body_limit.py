"""The body limit a reverse proxy in front of daphne enforces (README, "Operating it").

daphne takes in a whole request body before Django can answer 413, and neither has a setting that
refuses it earlier; so production puts a proxy limit in front, at the API's own limit. This keeps
the number the README gives the proxy equal to the limit the API enforces through a real daphne:
a proxy at that number refuses nothing the API would take, and lets through nothing it would not
refuse anyway.
"""

from __future__ import annotations

import re

import httpx
import pytest
from rest_framework.authtoken.models import Token

from tests.factories import Users
from tests.support import ROOT, AsgiServer
from workflows.apis.errors import body_limit

pytestmark = pytest.mark.django_db(transaction=True)


def proxy_limit() -> int:
    """The ``client_max_body_size`` the README tells production to set, in bytes."""
    sizes = re.findall(r"client_max_body_size (\d+)k;", (ROOT / "README.md").read_text())
    assert len(sizes) == 1, f"the README states one proxy body limit, not {sizes}"
    return int(sizes[0]) * 1024  # nginx's k is 1024 bytes


def padded(size: int) -> bytes:
    """A valid start request of exactly ``size`` bytes: a tiny payload, then JSON whitespace."""
    body = b'{"payload": {}}'
    return body + b" " * (size - len(body))


def test_the_readme_gives_the_proxy_the_apis_own_body_limit(asgi_server: AsgiServer, users: Users) -> None:
    # given the limit the README gives the proxy, at the default WORKFLOWS_MAX_PAYLOAD_BYTES
    limit = proxy_limit()
    token, _ = Token.objects.get_or_create(user=users.alice)
    headers = {"Authorization": f"Token {token.key}", "Content-Type": "application/json"}

    # when bodies of exactly that size and of one byte more are sent through daphne
    with httpx.Client(base_url=asgi_server.url, headers=headers, timeout=30) as client:
        at_limit = client.post("/api/workflows/test.echo/runs", content=padded(limit))
        over_limit = client.post("/api/workflows/test.echo/runs", content=padded(limit + 1))

    # then the API takes the first and refuses the second as too large: the same boundary
    assert limit == body_limit()
    assert at_limit.status_code == 201, at_limit.text
    assert over_limit.status_code == 413, over_limit.text
    assert over_limit.json()["error"]["code"] == "payload_too_large"
