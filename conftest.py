import pytest

pytest_plugins = ["tests.fixtures"]

# Handed out first. With --dist loadfile, pytest-xdist gives each test process a whole file at a
# time, in the order they were collected; the fault campaigns (one file, about three minutes on
# two cores) came last in that order, so one process ran them alone while the other sat idle.
FIRST = ("tests/test_chaos_campaign.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in FIRST)  # stable: the rest keep their order
