"""The ops app's place in the layers: at the top beside ``portal``, it reads the apps below it, and
nothing but ``config`` (and tests) imports it. Read from the source, imports inside functions included."""

from __future__ import annotations

from tests.layers import APPS, imported_apps, sources

READS = {"workflows", "ledger", "approvals", "agents", "webhooks", "ops"}


def test_ops_reads_only_the_apps_it_reports_on() -> None:
    for path in sources("ops"):
        assert imported_apps(path) <= READS, path


def test_nothing_but_config_imports_ops() -> None:
    for app in sorted(APPS - {"ops", "config"}):
        for path in sources(app):
            assert "ops" not in imported_apps(path), path
