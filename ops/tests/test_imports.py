"""The ops app's place in the layers: at the top beside ``portal``, it reads the apps below it, and
nothing but ``config`` (and tests) imports it. Read from the source, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
READS = {"workflows", "ledger", "approvals", "agents", "ops"}
APPS = {
    "workflows",
    "ledger",
    "approvals",
    "accounts",
    "agents",
    "webhooks",
    "schedules",
    "examples",
    "portal",
    "ops",
    "config",
}


def imported_apps(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & APPS


def is_test(path: Path) -> bool:
    return "tests" in path.relative_to(ROOT).parts


def test_ops_reads_only_the_apps_it_reports_on() -> None:
    for path in (ROOT / "ops").rglob("*.py"):
        if not is_test(path):
            assert imported_apps(path) <= READS, path


def test_nothing_but_config_imports_ops() -> None:
    for app in sorted(APPS - {"ops", "config"}):
        for path in (ROOT / app).rglob("*.py"):
            if not is_test(path):
                assert "ops" not in imported_apps(path), path
