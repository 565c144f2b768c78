"""``da.wait_first(handles)``: the first of several workflows to finish, recorded in a
workflow so that a replay makes the same choice."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

import dbos_agent as da
from dbos_agent._engine.handle import WorkflowHandle
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._engine.runtime.outcome import Outcome
from dbos_agent._engine.runtime.plans import run_plan
from dbos_agent._engine.runtime.waiting import finished_outcome
from tests.helpers import new_id

GATES: dict[str, threading.Event] = {}


@da.step
def pass_gate(key: str) -> str:
    assert GATES[key].wait(60), f"gate {key} never opened"
    return key


@da.durable_workflow
def first_gated(key: str) -> str:
    return pass_gate(key)


@da.step
def echo(value: str) -> str:
    return value


@da.durable_workflow
def pick(ids: list[str]) -> str:
    first = da.wait_first([da.retrieve(wid) for wid in ids])
    return echo(first.workflow_id)


def _gated(n: int) -> list[str]:
    keys = [new_id("gate") for _ in range(n)]
    for key in keys:
        GATES[key] = threading.Event()
    return keys


def test_outside_a_workflow_the_first_to_finish_comes_back(runtime: da.Runtime) -> None:
    slow_key, fast_key = _gated(2)
    slow = da.start(first_gated, slow_key)
    fast = da.start(first_gated, fast_key)
    GATES[fast_key].set()
    assert da.wait_first([slow, fast]) is fast
    assert fast.result(0) == fast_key
    assert slow.status() != da.WorkflowStatus.SUCCESS
    GATES[slow_key].set()
    assert slow.result(30) == slow_key


def test_when_several_have_finished_the_earliest_wins(runtime: da.Runtime) -> None:
    a_key, b_key = _gated(2)
    b = da.start(first_gated, b_key)
    GATES[b_key].set()
    b.result(30)
    a = da.start(first_gated, a_key)
    GATES[a_key].set()
    a.result(30)
    assert da.wait_first([a, b]) is b


def test_an_empty_list_is_refused(runtime: da.Runtime) -> None:
    with pytest.raises(ValueError, match="at least one handle"):
        da.wait_first([])
    with pytest.raises(ValueError, match="at least one handle"):
        asyncio.run(da.aio.wait_first([]))


def test_the_async_twin_waits_without_blocking_the_loop(runtime: da.Runtime) -> None:
    slow_key, fast_key = _gated(2)
    slow = da.start(first_gated, slow_key)
    fast = da.start(first_gated, fast_key)

    async def main() -> da.WorkflowHandle[str]:
        waiting = asyncio.ensure_future(da.aio.wait_first([slow, fast]))
        await asyncio.sleep(0)  # the wait is running on the loop, and the loop is free
        GATES[fast_key].set()
        return await waiting

    assert asyncio.run(main()) is fast
    GATES[slow_key].set()
    slow.result(30)


def test_in_a_workflow_the_choice_is_recorded_and_replayed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_key, fast_key = _gated(2)
    slow = da.start(first_gated, slow_key)
    fast = da.start(first_gated, fast_key)
    parent = da.start(pick, [slow.workflow_id, fast.workflow_id])
    GATES[fast_key].set()
    assert parent.result(30) == fast.workflow_id
    steps = da.operations.list_steps(parent.workflow_id)
    assert steps[0].name == "dbos_agent.wait_first"
    assert steps[0].output == fast.workflow_id

    GATES[slow_key].set()
    slow.result(30)

    def not_asked(ids: list[str]) -> str | None:
        raise AssertionError("a replay must not look again")

    monkeypatch.setattr(engine.db.workflows, "first_finished", not_asked)
    replay = da.operations.fork(parent.workflow_id, from_step=len(steps))  # every step replayed
    assert replay.result(30) == fast.workflow_id


def test_a_result_the_database_has_comes_back_before_the_run_resolves_its_future(
    runtime: da.Runtime,
) -> None:
    """A run commits its outcome, then resolves its future: in between (forced here by a
    future that never resolves), ``result(0)`` of a workflow ``wait_first`` saw finish
    returns the stored result, for a handle holding the future and for a wait that
    finds the run still active."""
    (key,) = _gated(1)
    GATES[key].set()
    handle = da.start(first_gated, key)
    assert handle.result(30) == key
    engine = current_engine()
    pending: Future[Outcome] = Future()
    assert WorkflowHandle(engine, handle.workflow_id, pending).result(0) == key
    assert asyncio.run(WorkflowHandle(engine, handle.workflow_id, pending).result_async(0)) == key
    found = run_plan(finished_outcome(engine.db, handle.workflow_id, 0, lambda: pending))
    assert found.unwrap() == key


def test_an_unfinished_workflow_still_times_out_at_once(runtime: da.Runtime) -> None:
    (key,) = _gated(1)
    handle = da.start(first_gated, key)
    try:
        with pytest.raises(TimeoutError, match="did not finish within 0"):
            handle.result(0)
    finally:
        GATES[key].set()
    assert handle.result(30) == key
