"""The engine's import graph: the Celery tasks are its entry point, and nothing imports back up.

Read from the source (``ast``), imports inside functions included, as those deferred to run time
are dependencies all the same; imports only for type checking are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent  # workflows/
SKIPPED = {"tests", "migrations"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not SKIPPED & set(path.relative_to(PACKAGE).parts)
    }


def is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported(node: ast.AST, package: str, modules: set[str]) -> set[str]:
    """The engine modules ``node`` imports, if it is an import statement of a module of ``package``."""
    targets: set[str] = set()
    if isinstance(node, ast.Import):
        targets = {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package, one level up for each dot past the first
            anchor = package.rsplit(".", node.level - 1)[0]
            base = f"{anchor}.{base}" if base else anchor
        # ``from workflows import hooks`` imports the module workflows.hooks; ``from workflows
        # import Workflow`` a name of the package's __init__.
        targets = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return targets & modules


def import_graph() -> dict[str, set[str]]:
    modules = engine_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        pending: list[ast.AST] = [ast.parse(path.read_text(), filename=str(path))]
        while pending:
            node = pending.pop()
            for child in ast.iter_child_nodes(node):
                if not is_type_checking(child):
                    edges |= imported(child, package, set(modules))
                    pending.append(child)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle, once, as the path that closes it."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target in path:
                found.append(path[path.index(target) :] + [target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_is_read_from_every_engine_module(graph: dict[str, set[str]]) -> None:
    assert {"workflows", "workflows.engine", "workflows.outbox", "workflows.tasks", "workflows.apis.runs"} <= set(graph)
    assert "workflows.outbox" in graph["workflows.engine"]
    assert "workflows.public" in graph["workflows"]  # an import inside a function counts


def test_no_engine_module_imports_the_celery_tasks(graph: dict[str, set[str]]) -> None:
    assert sorted(name for name, targets in graph.items() if "workflows.tasks" in targets) == []


def test_the_engine_has_no_import_cycle(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
