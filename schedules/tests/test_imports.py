"""The schedules app's place in the layers: it imports only the apps below it (and never
webhooks, its neighbour), and nothing but ``config`` and the demo's seed imports it. Read from the
source, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
APPS = {"workflows", "ledger", "approvals", "accounts", "agents", "webhooks", "schedules", "examples", "portal"}
BELOW = {"workflows", "ledger", "approvals", "accounts", "agents", "schedules"}
IMPORTERS = {Path("examples/demo/management/commands/seed_demo.py")}


def imported_apps(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & (APPS | {"config"})


def is_test(path: Path) -> bool:
    return "tests" in path.relative_to(ROOT).parts


def test_schedules_imports_only_the_apps_below_it() -> None:
    for path in (ROOT / "schedules").rglob("*.py"):
        if not is_test(path) and "migrations" not in path.parts:
            assert imported_apps(path) <= BELOW, path


def test_nothing_but_config_and_the_demo_seed_imports_schedules() -> None:
    for app in sorted(APPS - {"schedules"}):
        for path in (ROOT / app).rglob("*.py"):
            if not is_test(path) and path.relative_to(ROOT) not in IMPORTERS:
                assert "schedules" not in imported_apps(path), path
