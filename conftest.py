from collections import Counter

import pytest

pytest_plugins = ["tests.fixtures"]

# Handed out first: the fault campaigns, one file of about three minutes on two cores.
FIRST = ("tests/test_chaos_campaign.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order pytest-xdist hands whole files to its test processes (``--dist loadfile`` with
    ``--no-loadscope-reorder``, as scripts/test.sh runs it): FIRST, then the files with the most
    tests, as xdist itself would order them. Left to xdist, the campaigns' file, with two tests,
    came nearly last, and one process ran it alone at the end while the others had finished."""
    per_file = Counter(_file(item) for item in items)
    # Stable: a file's tests keep their order, and files of one size theirs.
    items.sort(key=lambda item: (_file(item) not in FIRST, -per_file[_file(item)]))


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]
