"""``manage.py check --deploy``: behind a proxy, the counts by client address need its header."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_client_address(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """HTTPS=1 says a proxy is in front: without CLIENT_ADDRESS_HEADER every request comes from its
    address, so SIGNIN_MAX_FAILURES_PER_ADDRESS failed sign-ins by anyone refuse everyone's, and
    WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS forged webhooks leave every sender's later
    rejections unrecorded."""
    signin, webhooks = settings.SIGNIN_MAX_FAILURES_PER_ADDRESS, settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS
    if not settings.HTTPS or settings.CLIENT_ADDRESS_HEADER or not (signin or webhooks):
        return []
    effects = []
    if signin:
        effects.append(f"{signin} failed sign-ins by anyone refuse everyone's for a while")
    if webhooks:
        effects.append(f"{webhooks} forged webhook deliveries stop every sender's rejections from being recorded")
    return [
        Warning(
            "CLIENT_ADDRESS_HEADER is not set behind a proxy (HTTPS=1): every request counts as the proxy's "
            f"address, and {' and '.join(effects)}.",
            hint="Set CLIENT_ADDRESS_HEADER to the header the proxy writes the client's address in "
            "(X-Forwarded-For, X-Real-IP), or SIGNIN_MAX_FAILURES_PER_ADDRESS=0 and "
            "WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS=0.",
            id="accounts.W001",
        )
    ]
