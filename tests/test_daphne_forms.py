"""daphne's requests leave a form body to Django (config/server.py): Twisted no longer parses it in
the reactor's thread first. A multipart body Twisted cannot parse shows which of the two read it:
Twisted refuses it with a bare 400 and closes the connection; Django's view answers as it would."""

from __future__ import annotations

import httpx
import pytest

from tests.support import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_multipart_body_reaches_django_unparsed_by_twisted(asgi_server: AsgiServer) -> None:
    # given a POST whose body is not the multipart its Content-Type says
    headers = {"Content-Type": "multipart/form-data; boundary=xyz"}

    # when it is sent through daphne to a view that takes no POST
    with httpx.Client(base_url=asgi_server.url, timeout=30) as client:
        response = client.post("/healthz", content=b"not multipart at all", headers=headers)

    # then Django's view answers it (its 405), not Twisted's 400
    assert response.status_code == 405, response.text
