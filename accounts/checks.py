"""``manage.py check --deploy``: behind a proxy, sign-in's counts need the client's address."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_client_address(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """HTTPS=1 says a proxy is in front: without CLIENT_ADDRESS_HEADER every sign-in comes from its
    address, and SIGNIN_MAX_FAILURES_PER_ADDRESS failures by anyone refuse everyone's."""
    if not settings.HTTPS or settings.CLIENT_ADDRESS_HEADER or not settings.SIGNIN_MAX_FAILURES_PER_ADDRESS:
        return []
    return [
        Warning(
            "CLIENT_ADDRESS_HEADER is not set behind a proxy (HTTPS=1): every sign-in counts as the proxy's "
            f"address, and {settings.SIGNIN_MAX_FAILURES_PER_ADDRESS} failed sign-ins by anyone refuse "
            "everyone's for a while.",
            hint="Set CLIENT_ADDRESS_HEADER to the header the proxy writes the client's address in "
            "(X-Forwarded-For, X-Real-IP), or SIGNIN_MAX_FAILURES_PER_ADDRESS=0.",
            id="accounts.W001",
        )
    ]
