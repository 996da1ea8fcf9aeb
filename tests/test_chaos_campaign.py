"""The fault campaign's short variant (bench/chaos.py --short): a minute of mixed load with a dozen
faults (worker process groups and beat SIGKILLed, Redis and PostgreSQL restarted, provider faults,
a dropped socket), then the outside checks. Every must-be-0 figure must be 0. It runs on both
brokers: Redis, and RabbitMQ (quorum queues, publisher confirms), which is restarted too.

It runs as a subprocess with servers of its own (a private PostgreSQL cluster, redis-server and
RabbitMQ node on free ports, its own queue and channel prefix): it restarts nothing another test
process uses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MUST_BE_ZERO = (
    "stuck (neither finished nor waiting for a person)",
    "completed step bodies executed twice",
    "atomic steps with their writes twice",
    "provider: effects per operation key above 1",
    "provider: orders refunded above their amount",
    "approvals decided twice",
    "chat streams with a gap or duplicate seq (stored)",
    "chat streams with a gap or duplicate seq (received)",
    "webhook events with two effects",
)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("broker", "faults_injected"), [("redis", 12), ("rabbitmq", 13)])
def test_short_campaign_keeps_every_promise(broker: str, faults_injected: int) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--short", "--seed", "7", "--broker", broker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
    )
    report = f"stdout:\n{done.stdout[-8000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    for figure in MUST_BE_ZERO:
        line = next((x for x in done.stdout.splitlines() if figure in x), None)
        assert line is not None, f"{figure!r} not printed\n{report}"
        assert re.search(r"\s0\s+0\s+PASS$", line), f"{line}\n{report}"
    assert re.search(r"atomic steps completed without their writes \(of [\d,]+\)\s+0\s", done.stdout), report
    faults = re.search(r"faults injected\s+(\d+)", done.stdout)
    assert faults is not None and int(faults.group(1)) == faults_injected, report
    if broker == "rabbitmq":
        assert re.search(r"broker_restart \(1\): recovery p50 / p99", done.stdout), report
