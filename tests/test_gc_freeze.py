"""The ASGI server and each worker process take what they loaded at start (Django, the apps) out of
the garbage collector's generations (``gc.freeze``), so that its full collections stop walking it:
they paused a daphne here for tens of milliseconds at a time. Each in a process of its own, since
freezing is for the life of a process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def frozen_after(code: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", f"import gc\n{code}\nprint(gc.get_freeze_count())"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_the_asgi_application_freezes_what_it_loaded() -> None:
    assert frozen_after("import config.asgi") > 10_000


WORKER = """
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
import config.celery
from celery import signals
assert gc.get_freeze_count() == 0
signals.worker_process_init.send(sender=None)  # as Celery sends it in each new worker process
"""


def test_a_worker_process_freezes_what_it_loaded_when_it_starts() -> None:
    assert frozen_after(WORKER) > 10_000
