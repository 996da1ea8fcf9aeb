"""Multiprocess mode across processes: a real Celery worker (prefork) runs a workflow, and a real
daphne's ``/metrics`` shows the worker's step histogram: the two share PROMETHEUS_MULTIPROC_DIR."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import AsgiServer, Worker, wait_for_status
from workflows.models import RunStatus
from workflows.services import run_start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TOKEN = "a-metrics-token-for-the-tests"


def test_the_web_process_shows_what_a_worker_process_counted(tmp_path: Path, queue: str, workers: list[Worker]) -> None:
    # given a worker and a web server sharing a fresh multiprocess folder
    folder = str(tmp_path / "prometheus")
    Path(folder).mkdir()
    workers.append(Worker(queue=queue, concurrency=1, PROMETHEUS_MULTIPROC_DIR=folder))
    server = AsgiServer(PROMETHEUS_MULTIPROC_DIR=folder, METRICS_TOKEN=TOKEN)
    try:
        # when the worker runs a three-step workflow
        run, _ = run_start(workflow="test.lines", payload={"path": str(tmp_path / "lines"), "steps": 3})
        wait_for_status(run.id, RunStatus.COMPLETED)

        # then daphne's /metrics counts its three steps, one try each, and the run's end
        response = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    completed = (("outcome", "completed"), ("workflow", "test.lines"))
    assert samples[("workflows_step_duration_seconds_count", completed)] == 3
    assert samples[("workflows_step_tries_sum", completed)] == 3
    ended = (("reason", ""), ("status", "completed"), ("workflow", "test.lines"))
    assert samples[("workflows_runs_finished_total", ended)] == 1
    # read from the database by daphne at the scrape: the run is no longer counted as unfinished
    assert samples[("workflows_runs", (("status", "queued"), ("workflow", "test.lines")))] == 0
    assert any(name.startswith("histogram_") for name in (p.name for p in Path(folder).iterdir()))
