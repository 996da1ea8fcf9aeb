"""What the layering tests of the apps read: which project apps a module imports, found in its
source (imports inside functions included), so a test can say which apps an app may use and which
may use it (docs/architecture.md, "Apps and layers")."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = frozenset(
    {
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
)


def imported_apps(path: Path) -> set[str]:
    """The project apps ``path`` imports (absolute imports, at any depth of the module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & APPS


def sources(app: str, *, migrations: bool = True) -> Iterator[Path]:
    """The app's modules, its tests left out (and its migrations, unless ``migrations``)."""
    for path in sorted((ROOT / app).rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if "tests" not in parts and (migrations or "migrations" not in parts):
            yield path
