"""The webhooks app's place in the layers: it imports only the apps below it, and nothing but
``config`` and ``ops`` (its gauges read the deliveries, as they read the other apps' rows) imports
it. Read from the source, imports inside functions included."""

from __future__ import annotations

from tests.layers import APPS, imported_apps, sources

BELOW = {"workflows", "ledger", "approvals", "accounts", "agents", "webhooks"}


def test_webhooks_imports_only_the_apps_below_it() -> None:
    for path in sources("webhooks", migrations=False):
        assert imported_apps(path) <= BELOW, path


def test_nothing_but_config_and_ops_imports_webhooks() -> None:
    for app in sorted(APPS - {"webhooks", "config", "ops"}):
        for path in sources(app):
            assert "webhooks" not in imported_apps(path), path
