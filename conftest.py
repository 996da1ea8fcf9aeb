import os
import shutil
import tempfile
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


def pytest_configure(config: pytest.Config) -> None:
    """Every temporary file of the run (the servers' and workers' logs, beat's schedules, the
    worker pools' folders, the browsers' profiles) goes into one folder of this process's own,
    removed when the run passes: a run used to leave about 1,700 of them in the system's. Its child
    processes use it too (TMPDIR), and pytest-xdist's test processes make theirs inside the one of
    the process that started them. Others may pass through it: a campaign's PostgreSQL runs as the
    postgres user, in a folder of its own below."""
    folder = tempfile.mkdtemp(prefix="durable-tests-")
    os.chmod(folder, 0o755)
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    config.stash[TEMPORARY] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's temporary folder goes if the run passed; kept (and named) with a failure's logs."""
    folder = config.stash.get(TEMPORARY, None)
    if folder is None:
        return
    if config.stash.get(FAILED, False):
        print(f"\nthe run's temporary files (logs of its servers and workers) are kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[FAILED] = exitstatus != 0


TEMPORARY = pytest.StashKey[str]()
FAILED = pytest.StashKey[bool]()
