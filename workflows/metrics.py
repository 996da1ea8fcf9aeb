"""The engine's event metrics (Prometheus), counted by the processes where the events happen.

What the database can say at any time (runs by status, the oldest due timer, the oldest queued run)
is read from it when ``/metrics`` is scraped (``ops.metrics``), never kept here. These are the
events only a process sees: how long each try of a step took, how many tries a step needed, the
recoveries and why, the runs that ended. With ``PROMETHEUS_MULTIPROC_DIR`` set, before the process
starts, prometheus-client keeps each process's values in a file of that folder and the web
process's ``/metrics`` adds them up; without it they stay in this process (README "Metrics").

Labels are bounded: registered workflow names, outcomes and reasons from fixed lists. Never a step
name (a workflow may build them from data), a run id or anything from a payload.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

STEP_SECONDS = Histogram(
    "workflows_step_duration_seconds",
    "Seconds one try of a step's body took, by workflow and what became of the try "
    "(completed; retried: it failed and will be tried again; failed: for good).",
    ["workflow", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0),
)
STEP_TRIES = Histogram(
    "workflows_step_tries",
    "Tries a step took when it ended (completed, or failed for good), by workflow and outcome: "
    "1 means it never retried.",
    ["workflow", "outcome"],
    buckets=(1, 2, 3, 4, 6, 11, 21),
)
RECOVERIES = Counter(
    "workflows_recoveries",
    "Runs recovered, by reason: lease_expired (a claim took over a run whose worker died), "
    "lost_enqueue (the sweeper sent a queued run's lost message again), step_overran (a step body "
    "ran past its timeout and grace: its lease is left to expire), database_error (the engine left "
    "a run to recovery after losing the database), process_ended (a worker process ended itself, its "
    "step body stuck past its timeout and twice the grace).",
    ["reason"],
)
RUNS_FINISHED = Counter(
    "workflows_runs_finished",
    "Runs that ended, by workflow, status (completed, failed, terminated) and failure reason.",
    ["workflow", "status", "reason"],
)


def step_observed(workflow: str, outcome: str, seconds: float, tries: int) -> None:
    """One try of a step ended: its duration; and, if the step ended with it, its tries."""
    STEP_SECONDS.labels(workflow, outcome).observe(seconds)
    if outcome != "retried":
        STEP_TRIES.labels(workflow, outcome).observe(tries)
