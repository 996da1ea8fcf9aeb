"""``manage.py check --deploy`` with a production environment reports no issue at all."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from typing import Any

from ops.checks import check_metrics_token
from tests.support import ROOT

PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "durable.example.com",
    "HTTPS": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "METRICS_TOKEN": secrets.token_urlsafe(32),
    "LOG_FORMAT": "json",
    "CLIENT_ADDRESS_HEADER": "X-Forwarded-For",  # behind the proxy HTTPS says is there
}


def check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    # As a production project runs: without the examples (and the suite's own workflow modules).
    base = {k: v for k, v in os.environ.items() if k not in ("INSTALL_EXAMPLES", "WORKFLOWS_MODULES", "DEBUG")}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_production_settings() -> None:
    done = check_deploy(**PRODUCTION)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "System check identified no issues (0 silenced).", done.stdout + done.stderr


def test_check_deploy_warns_behind_a_proxy_without_the_client_address_header() -> None:
    done = check_deploy(**{**PRODUCTION, "CLIENT_ADDRESS_HEADER": ""})
    assert done.returncode == 0, done.stderr
    assert "(accounts.W001) CLIENT_ADDRESS_HEADER is not set behind a proxy" in done.stderr + done.stdout


def test_check_deploy_warns_without_a_metrics_token(settings: Any) -> None:
    # /metrics would refuse every scrape (with DEBUG off), or take a guessable token
    settings.METRICS_TOKEN = ""
    assert [message.id for message in check_metrics_token()] == ["ops.W001"]
    settings.METRICS_TOKEN = "short"
    assert [message.id for message in check_metrics_token()] == ["ops.W002"]
    settings.METRICS_TOKEN = PRODUCTION["METRICS_TOKEN"]
    assert check_metrics_token() == []
