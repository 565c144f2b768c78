"""Deadlines: a workflow started inside ``da.workflow_timeout`` is cancelled, with the
workflows it started, once it is still unfinished at its deadline (database clock);
one that finishes in time is untouched, and a restart keeps the first deadline."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector, advance_clock, sweep_once
from tests.helpers import new_id, wait_until

STEPS: Counter[str] = Counter()


@da.step
def tick(workflow_id: str) -> None:
    STEPS[workflow_id] += 1


@da.durable_workflow(name="deadlines_busy")
def busy(rounds: int) -> int:
    """Many short steps: a cancel stops it before the next one."""
    wid = da.current_workflow_id() or ""
    for _ in range(rounds):
        tick(wid)
        time.sleep(0.05)
    return rounds


@da.durable_workflow(name="deadlines_sleeper")
def sleeper(seconds: float) -> str:
    da.sleep(seconds)
    return "woke"


@da.durable_workflow(name="deadlines_parent")
def parent() -> str:
    child = da.start(sleeper, 3600.0, workflow_id=f"{da.current_workflow_id()}-child")
    return child.result()


def test_a_running_workflow_past_its_deadline_stops_at_its_next_step(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    with da.workflow_timeout(1.0):
        handle = da.start(busy, 10_000)
    with pytest.raises(da.WorkflowTimeoutError, match="passed its deadline"):
        handle.result(timeout=30)
    assert inspector.status(handle.workflow_id) == "CANCELLED"
    done = STEPS[handle.workflow_id]
    # its run has ended (it may have been mid-step when the result came): nothing after
    wait_until(lambda: handle.workflow_id not in runtime.running(), message="the run ended")
    assert STEPS[handle.workflow_id] == done < 10_000


def test_a_suspended_workflow_and_its_children_are_cancelled_at_the_deadline(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = new_id("deadline-tree")
    with da.workflow_timeout(600), da.workflow_id(wid):
        handle = da.start(parent)
    wait_until(
        lambda: (
            inspector.statuses([wid, f"{wid}-child"])
            == {wid: "SUSPENDED", f"{wid}-child": "SUSPENDED"}
        ),
        message="parent and child suspended",
    )
    advance_clock(601)
    with pytest.raises(da.WorkflowTimeoutError):
        handle.result(timeout=30)
    # the child inherited its parent's deadline (as in DBOS): cancelled by its own, or
    # with its parent, whichever the sweep met first
    with pytest.raises(da.WorkflowCancelledError, match=r"which started it|passed its deadline"):
        da.retrieve(f"{wid}-child").result(timeout=30)
    assert inspector.statuses([wid, f"{wid}-child"]) == {
        wid: "CANCELLED",
        f"{wid}-child": "CANCELLED",
    }


def test_a_workflow_that_finishes_in_time_keeps_its_result(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    with da.workflow_timeout(30):
        assert busy(3) == 3  # a direct call, with a deadline
        handle = da.start(sleeper, 0.1)
    assert handle.result(timeout=30) == "woke"
    advance_clock(60)
    assert handle.workflow_id not in sweep_once().cancelled  # a deadline pass, now
    assert inspector.status(handle.workflow_id) == "SUCCESS"


def test_starting_again_keeps_the_first_deadline(runtime: da.Runtime, inspector: Inspector) -> None:
    wid = new_id("deadline-again")
    with da.workflow_timeout(100), da.workflow_id(wid):
        handle = da.start(sleeper, 3600.0)
    with da.workflow_timeout(10_000), da.workflow_id(wid):
        da.start(sleeper, 3600.0)  # the same workflow: its deadline stays
    advance_clock(101)
    with pytest.raises(da.WorkflowTimeoutError):
        handle.result(timeout=30)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "10"])
def test_a_bad_timeout_is_refused_naming_it(bad: object) -> None:
    match = "workflow_timeout: seconds must be a number > 0"
    with pytest.raises(ValueError, match=match), da.workflow_timeout(bad):  # type: ignore[arg-type]
        pass
