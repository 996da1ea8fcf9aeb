"""The embedded default (an SQLite file, what ``scripts/run.sh`` runs) through the paths its code
takes where PostgreSQL's raw statements cannot go: the engine's claim and start, the queue's count,
the chunk writer's fenced writes, the turn's end. The suite's database is PostgreSQL, so this runs
in a process of its own on a fresh SQLite file: migrate, seed the demo, answer two of alice's chat
messages (the second calls the refund tools and starts the refund's run) by advancing their runs in
that process, as a worker would.

A run's id read back by the engine's own statements on SQLite was once text where the turn's was a
UUID: every chat turn of the demo failed as answered by another run (ForeignTurn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json

import django

django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command

call_command("migrate", verbosity=0)
call_command("seed_demo", verbosity=0)

from agents.models import Chunk
from agents.selectors import agent_get
from agents.services import message_send
from examples.refunds.models import RefundRequest
from workflows import engine
from workflows.models import WorkflowRun

alice = User.objects.get(username="alice")
agent = agent_get(user=alice, kind="support", name="help")
answers = []
for text in ["hello", "I'd like a refund for order 1042 because it arrived damaged"]:
    turn = message_send(agent=agent, user=alice, text=text)
    status = engine.advance(turn.run_id)
    turn.refresh_from_db()
    seqs = list(Chunk.objects.filter(turn=turn).order_by("seq").values_list("seq", flat=True))
    whole = seqs == list(range(1, len(seqs) + 1))
    answers.append({"run": status, "turn": turn.status, "text": turn.text, "seqs": whole})
refund = RefundRequest.objects.get()
run = WorkflowRun.objects.get(pk=refund.run_id)
engine.advance(run.id)
run.refresh_from_db()

# The admin's lists, filtered by what SQLite cannot run (config/admin.py): a 400 that says so.
from django.test import Client

admin = Client(SERVER_NAME="localhost")
admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
filters = {
    url: admin.get(url).status_code
    for url in (
        "/admin/auth/user/?username__regex=[",
        "/admin/webhooks/webhookdelivery/?body__contains=x",
        "/admin/auth/user/?id__in=99999999999999999999",
    )
}
print(json.dumps({"answers": answers, "refund": [str(refund.amount), run.status, run.wait_step], "filters": filters}))
"""


def test_the_sqlite_demo_answers_its_chat_and_starts_a_refund(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "INSTALL_EXAMPLES": "1",
        "AGENTS_MODULES": "",
        "WORKFLOWS_MODULES": "",
        "CELERY_BROKER_URL": "memory://",  # the runs are advanced here: nothing is sent anywhere
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    hello, refund = out["answers"]
    assert (hello["run"], hello["turn"], hello["seqs"]) == ("completed", "completed", True), hello
    assert hello["text"].startswith("Hello! I can ask for a refund")
    assert (refund["run"], refund["turn"], refund["seqs"]) == ("completed", "completed", True), refund
    assert refund["text"] == (
        "I've asked for a refund of £150.00 on order 1042. It is awaiting approval; I'll tell you here when it changes."
    )
    # and the refund's own run went as far as it goes without a person: waiting for an approver
    assert out["refund"] == ["150.00", "waiting", "refund approval: decision"]
    # and the admin's lists answer a filter SQLite cannot run with a 400, not a 500
    assert set(out["filters"].values()) == {400}, out["filters"]
