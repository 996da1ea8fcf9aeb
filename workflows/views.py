"""Pages. Thin: authorise, read through a selector, render."""

from __future__ import annotations

import json
import math
from typing import Any, TypeGuard
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from workflows import hooks
from workflows.selectors import RunSnapshot, can_see_all_runs, run_get, run_snapshot


def attempts_with_steps(snapshot: RunSnapshot) -> list[dict[str, Any]]:
    """The timeline grouped by attempt, newest attempt first (the page's JS groups the same way)."""
    by_number: dict[int, dict[str, Any]] = {a["number"]: {**a, "steps": []} for a in snapshot["attempts"]}
    for step in snapshot["timeline"]:
        attempt = by_number.setdefault(
            step["attempt"],
            {
                "number": step["attempt"],
                "status": "",
                "error": None,
                "started_at": None,
                "finished_at": None,
                "steps": [],
            },
        )
        attempt["steps"].append(step)
    return [by_number[n] for n in sorted(by_number, reverse=True)]


def progress_view(progress: Any) -> dict[str, Any]:
    """Percent and text of a progress value: ``{"percent": n}`` or ``{"done": d, "total": t}``
    give a bar, a ``"stage"`` string is shown in words; anything else is shown as JSON. Floored, so
    100% means finished (the JS agrees)."""
    percent: int | None = None
    text = "" if progress is None else json.dumps(progress)
    if isinstance(progress, dict):
        given, done, total = progress.get("percent"), progress.get("done"), progress.get("total")
        if _is_number(given):
            percent = math.floor(given)
            text = f"{percent}%"
        elif _is_number(done) and _is_number(total) and total > 0:
            percent = math.floor(done * 100 / total)
            text = f"{done} / {total} ({percent}%)"
    if percent is not None:
        percent = max(0, min(100, percent))
    stage = progress.get("stage") if isinstance(progress, dict) else None
    if isinstance(stage, str) and stage:  # a stage in words ("awaiting approval") reads as words
        text = f"{stage} · {text}" if percent is not None else stage
    return {"percent": percent, "text": text}


def _pretty(value: Any) -> str | None:
    return None if value is None else json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@login_required
def run_detail(request: HttpRequest, run_id: UUID) -> HttpResponse:
    """The run's timeline and progress; the page then follows ``/ws/runs/<id>/`` live."""
    run = run_get(user=request.user, run_id=run_id)
    if run is None:
        # The same answer for another user's run and a missing one: do not confirm it exists.
        raise Http404("No such run.")
    snapshot = run_snapshot(run=run, user=request.user)
    context = {
        "run": snapshot,
        "attempts": attempts_with_steps(snapshot),
        "progress": progress_view(snapshot["progress"]),
        "result_json": _pretty(snapshot["result"]),
        "error_json": _pretty(snapshot["error"]),
        "ws_path": f"/ws/runs/{run.id}/",
        # What other apps flag for staff (the ledger's operations needing reconciliation): staff data,
        # worded for them ("do not tell the customer..."), so not on the owner's page.
        "sections": hooks.run_sections(run) if can_see_all_runs(request.user) else [],
    }
    return render(request, "workflows/run_detail.html", context)
