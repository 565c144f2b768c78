"""A failing dependency is waited out durably: a step's transient failures past a moment
are RETRYING on its row (attempts, last error, next attempt), a background workflow is
SUSPENDED meanwhile, and only past ``give_up_after`` (or for an error that is not
transient) is the error recorded. Time is moved on the database clock."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest

import dbos_agent as da
from dbos_agent.errors import DependencyUnavailableError, InvalidOptionError
from dbos_agent.records import StepStatus, WorkflowStatus
from dbos_agent.testing import Inspector, advance_clock, sweep_once
from tests.helpers import new_id, per_test, wait_until

CALLS: Counter[str] = per_test(Counter())
#: How many more attempts of each workflow's step fail (by workflow id).
FAILURES: dict[str, int] = per_test({})


def _attempt(kind: type[Exception]) -> str:
    wid = da.current_workflow_id()
    assert wid is not None
    CALLS[wid] += 1
    if FAILURES.get(wid, 0) > 0:
        FAILURES[wid] -= 1
        raise kind(f"down ({CALLS[wid]})")
    return f"ok after {CALLS[wid]}"


@da.step(interval=20, max_interval=20, jitter=0, retry_on=(ConnectionError,), give_up_after=3600)
def call_api() -> str:
    return _attempt(ConnectionError)


@da.step(interval=20, jitter=0, retry_on=(ConnectionError,), give_up_after=30)
def short_horizon() -> str:
    return _attempt(ConnectionError)


@da.step(interval=20, jitter=0, retry_on=(ConnectionError,), give_up_after=3600)
def refused() -> str:
    return _attempt(ValueError)


@da.durable_workflow
def uses_api() -> str:
    return call_api()


@da.durable_workflow
def uses_short_horizon() -> str:
    return short_horizon()


@da.durable_workflow
def uses_refused() -> str:
    return refused()


def _start(fn: Callable[[], str], failures: int) -> str:
    wid = new_id("retry")
    FAILURES[wid] = failures
    da.start(fn, workflow_id=wid)
    return wid


def _retrying(inspector: Inspector, wid: str) -> bool:
    info = inspector.workflow(wid)
    return info is not None and info.status is WorkflowStatus.SUSPENDED


def test_a_transient_failure_suspends_the_workflow_until_its_next_attempt(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = _start(uses_api, failures=2)
    wait_until(lambda: _retrying(inspector, wid))
    info = inspector.workflow(wid)
    assert info is not None and info.waiting_for is not None
    assert info.waiting_for.kind == "retry" and info.waiting_for.name == "call_api"
    retrying = info.retrying
    assert retrying is not None
    assert (retrying.seq, retrying.step, retrying.attempts) == (0, "call_api", 1)
    assert retrying.waiting_for == "call_api"
    assert retrying.last_error is not None and "down (1)" in retrying.last_error["message"]
    assert 19 <= (retrying.next_at - retrying.since).total_seconds() <= 21
    [step] = inspector.steps(wid)
    assert step.status is StepStatus.RETRYING and step.retry is not None
    # no thread, no task waits for it (once the run that wrote the row has unwound)
    wait_until(lambda: runtime.running() == [], 30, "the suspended run released")

    advance_clock(25)  # the next attempt is due: it fails again, and waits again
    wait_until(lambda: CALLS[wid] == 2 and _retrying(inspector, wid))
    again = inspector.workflow(wid)
    assert again is not None and again.retrying is not None
    assert again.retrying.attempts == 2
    assert again.retrying.since == retrying.since  # the horizon counts from the first

    advance_clock(25)
    assert da.retrieve(wid).result(timeout=30) == "ok after 3"
    [done] = inspector.steps(wid)
    assert (done.status, done.attempts, done.retry) == (StepStatus.SUCCESS, 3, None)
    finished = inspector.workflow(wid)
    assert finished is not None and finished.retrying is None


def test_past_its_horizon_the_last_error_is_recorded(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = _start(uses_short_horizon, failures=100)
    wait_until(lambda: _retrying(inspector, wid))
    advance_clock(21)  # attempt 2, at 20 s: fails; the next would be past 30 s: at 30 s
    wait_until(lambda: CALLS[wid] == 2 and _retrying(inspector, wid))
    advance_clock(11)
    with pytest.raises(ConnectionError, match="down \\(3\\)"):
        da.retrieve(wid).result(timeout=30)
    [step] = inspector.steps(wid)
    assert (step.status, step.attempts) == (StepStatus.ERROR, 3)


def test_an_error_the_step_does_not_retry_is_recorded_at_once(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = _start(uses_refused, failures=1)
    with pytest.raises(ValueError, match="down"):
        da.retrieve(wid).result(timeout=30)
    assert CALLS[wid] == 1


def test_a_direct_call_waits_in_its_caller_and_retry_now_ends_the_wait(
    runtime: da.Runtime, inspector: Inspector, dbos_agent_database_url: str
) -> None:
    wid = new_id("direct")
    FAILURES[wid] = 1
    result: list[str] = []

    def call() -> None:
        with da.workflow_id(wid):
            result.append(uses_api())

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: (info := inspector.workflow(wid)) is not None and info.retrying is not None)
    info = inspector.workflow(wid)
    assert info is not None and info.status is WorkflowStatus.PENDING  # its caller waits
    with da.Client(dbos_agent_database_url) as client:
        client.retry(wid)
    caller.join(30)
    assert result == ["ok after 2"]


def test_retry_now_wakes_a_suspended_workflow(
    runtime: da.Runtime, inspector: Inspector, dbos_agent_database_url: str
) -> None:
    wid = _start(uses_api, failures=1)
    wait_until(lambda: _retrying(inspector, wid))
    with da.Client(dbos_agent_database_url) as client:
        assert client.retry(wid) == 1
    assert da.retrieve(wid).result(timeout=30) == "ok after 2"


def test_dependency_unavailable_is_transient_whatever_retry_on_says() -> None:
    policy = da.RetryPolicy(retry_on=(ConnectionError,), give_up_after=60)
    assert policy.transient(DependencyUnavailableError("MCP server 'x' is down"))
    assert policy.transient(ConnectionError())
    assert not policy.transient(ValueError())
    assert policy.delay_before_retry(1, DependencyUnavailableError("down")) is None


@pytest.mark.parametrize("bad", [-1, math.nan, "1h", True, [3]])
def test_give_up_after_is_checked_when_the_step_is_defined(bad: object) -> None:
    with pytest.raises(InvalidOptionError, match="give_up_after"):
        da.step(give_up_after=bad)(lambda: None)  # type: ignore[call-overload]


def test_give_up_after_takes_a_timedelta_and_infinity() -> None:
    assert da.RetryPolicy(give_up_after=timedelta(hours=1)).give_up_after == 3600.0  # type: ignore[arg-type]
    assert da.RetryPolicy(give_up_after=math.inf).give_up_after == math.inf


def test_sweep_leaves_a_retry_that_is_not_due(runtime: da.Runtime, inspector: Inspector) -> None:
    wid = _start(uses_api, failures=1)
    wait_until(lambda: _retrying(inspector, wid))
    assert wid not in sweep_once().woken
    assert CALLS[wid] == 1
