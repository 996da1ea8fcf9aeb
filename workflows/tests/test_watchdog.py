"""The watchdog's timing, in this process with its kill recorded instead of sent.

That a real prefork child ends itself and the pool replaces it is in test_engine_recovery.py.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from workflows import watchdog as module
from workflows.watchdog import Watchdog

GRACE = 0.05


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[tuple[int, int]]:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "STEP_TIMEOUT_GRACE_SECONDS": GRACE}
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def test_a_body_past_its_timeout_and_twice_the_grace_ends_the_process(kills: list[tuple[int, int]]) -> None:
    watchdog = Watchdog()
    watchdog.armed = True
    started = time.monotonic()
    with watchdog.watching(0.1, "step 'x' try 1 ran past its timeout of 0.1s"):
        while not kills and time.monotonic() - started < 5:
            time.sleep(0.01)
    elapsed = time.monotonic() - started
    assert kills == [(os.getpid(), signal.SIGKILL)]
    assert 0.1 + 2 * GRACE <= elapsed < 1.0


def test_a_body_that_ends_in_time_is_forgotten(kills: list[tuple[int, int]]) -> None:
    watchdog = Watchdog()
    watchdog.armed = True
    for _ in range(3):
        with watchdog.watching(0.1, "a step"):
            time.sleep(0.05)
    time.sleep(0.1 + 2 * GRACE + 0.2)
    assert kills == []


def test_a_watchdog_not_armed_starts_no_thread(kills: list[tuple[int, int]]) -> None:
    watchdog = Watchdog()
    with watchdog.watching(0.01, "a step"):
        time.sleep(0.2)
    assert kills == []
    assert watchdog._thread is None


def test_only_a_pool_child_is_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Celery sends worker_process_init in each prefork child and, from a solo pool, in the worker
    # itself: only the first is a daemonic process, which the pool replaces when it ends
    import billiard.process

    class Process:
        daemon = False

    monkeypatch.setattr(billiard.process, "current_process", lambda: Process)
    monkeypatch.setattr(module, "watchdog", Watchdog())
    module.arm()
    assert module.watchdog.armed is False
    Process.daemon = True
    module.arm()
    assert module.watchdog.armed is True
