"""The schedules app's place in the layers: it imports only the apps below it (and never
webhooks, its neighbour), and nothing but ``config`` and the demo's seed imports it. Read from the
source, imports inside functions included."""

from __future__ import annotations

from pathlib import Path

from tests.layers import APPS, ROOT, imported_apps, sources

BELOW = {"workflows", "ledger", "approvals", "accounts", "agents", "schedules"}
IMPORTERS = {Path("examples/demo/management/commands/seed_demo.py")}


def test_schedules_imports_only_the_apps_below_it() -> None:
    for path in sources("schedules", migrations=False):
        assert imported_apps(path) <= BELOW, path


def test_nothing_but_config_and_the_demo_seed_imports_schedules() -> None:
    for app in sorted(APPS - {"schedules", "config"}):
        for path in sources(app):
            if path.relative_to(ROOT) not in IMPORTERS:
                assert "schedules" not in imported_apps(path), path
