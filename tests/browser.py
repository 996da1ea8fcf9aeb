"""A real browser for tests: Playwright (a test extra) driving Debian's Chromium, which
scripts/test.sh installs. Playwright's own browser download does not work offline, so it is never used.

Missing is a failure, not a skip: a skipped browser test would hide a broken page.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connections

T = TypeVar("T")

CHROMIUM = "/usr/bin/chromium"
# Headless as root, and quiet: without the background-networking flag Chromium keeps calling out,
# which this machine's closed network refuses.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TIMEOUT_MS = 60_000  # generous: two shared cores


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed on the way out."""
    from playwright import sync_api

    assert shutil.which(CHROMIUM), f"{CHROMIUM} is missing: scripts/test.sh installs it (apt-get install chromium)"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any, **context: Any) -> Any:
    """A page of a fresh context (``context``: Playwright's new_context options), with the tests' timeout."""
    page = browser.new_context(**context).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    return page


def off_loop(fn: Callable[[], T]) -> T:
    """Run Django ORM code outside Playwright's event loop (Django refuses it inside one)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc
        finally:
            connections.close_all()  # this thread's own connection would outlive the test database

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
