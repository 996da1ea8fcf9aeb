"""The catch-all of the ``api/`` routes (its own module: errors.py is imported by DRF's settings,
so it cannot import DRF's views)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView


@extend_schema(exclude=True)
class ApiNotFound(APIView):
    """Any ``/api/...`` path that no API matched, whatever the method: the API's JSON 404 rather
    than Django's HTML page, so a client always gets the one error shape. No authentication: an
    unknown path is unknown to everyone (and a 401 would suggest it exists)."""

    authentication_classes = []
    permission_classes = []

    def http_method_not_allowed(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Response:
        raise exceptions.NotFound()

    options = http_method_not_allowed  # APIView answers OPTIONS itself otherwise
