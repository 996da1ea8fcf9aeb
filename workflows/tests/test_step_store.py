"""The step store's checks, in process: what PostgreSQL cannot store, and the step time limit."""

from __future__ import annotations

import json
import signal
import time

import pytest

from workflows import StepTimeout, step_store
from workflows.exceptions import NotSerializable
from workflows.storable import json_problem


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("\ud800", "an unpaired surrogate (\\ud800), which is not valid Unicode"),
        ({"a": ["x\u0000"]}, "a NUL character (\\u0000), which cannot be stored"),
        ({"\udfff": 1}, "an unpaired surrogate (\\udfff), which is not valid Unicode"),  # in a key
        ([1, [2, ["\ud83d"]]], "an unpaired surrogate (\\ud83d), which is not valid Unicode"),  # half an emoji
    ],
)
def test_a_value_postgresql_cannot_store_is_not_serialisable(value: object, problem: str) -> None:
    with pytest.raises(NotSerializable) as refused:
        step_store.encode(value, what="the result of step 'x'")

    assert str(refused.value) == f"the result of step 'x' contains {problem}"


@pytest.mark.parametrize(
    "value",
    [
        "\ud83d\ude00",  # a valid pair: JSON joins it into one character
        "😀 한국어 é",  # escapes that look like surrogates (Hangul is \ud5xx-\ud7xx) but are not
        "a \\u0000 and a \\ud800 spelled out",  # backslashes, not the characters
        {"nested": ["plain", 1, None, 2.5]},
    ],
)
def test_values_postgresql_can_store_pass(value: object) -> None:
    stored, text = step_store.encode(value, what="it")

    assert stored == json.loads(text)


def test_error_messages_are_made_storable() -> None:
    record = step_store.error_record(ValueError("bad \x00 and \ud800"))

    assert record["message"] == "bad \\x00 and \\ud800"
    json.dumps(record).encode("utf-8")  # and nothing in it that jsonb refuses
    assert json_problem(record) is None


@pytest.mark.parametrize("seconds", [0, -1, float("nan")])
def test_a_time_limit_of_zero_or_less_is_refused_before_touching_the_signal(seconds: float) -> None:
    # (pytest-timeout has its own SIGALRM handler and timer running: both must be left as they are)
    handler, (remaining, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)

    with pytest.raises(ValueError, match="more than 0 seconds"):
        with step_store.time_limit(seconds, "too short"):
            pytest.fail("the body must not run")

    assert signal.getsignal(signal.SIGALRM) is handler
    assert remaining - 1 < signal.getitimer(signal.ITIMER_REAL)[0] <= remaining


def test_a_body_that_swallows_the_timeout_still_times_out_when_it_returns() -> None:
    with pytest.raises(StepTimeout, match="late"):
        with step_store.time_limit(0.1, "late"):
            try:
                time.sleep(5)
            except StepTimeout:
                pass  # swallowed
            time.sleep(0.05)
