"""``da.run_step`` and ``aio.run_step``: an undecorated function called as a durable step,
with the options of ``@da.step``; a plain call outside a workflow."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent import aio
from tests.helpers import new_id, per_test

CALLS: Counter[str] = per_test(Counter())


def lookup(key: str, *, suffix: str = "") -> str:
    """A plain function: no decorator."""
    CALLS[key] += 1
    return f"{key}{suffix}"


def flaky(key: str, failures: int) -> int:
    CALLS[key] += 1
    if CALLS[key] <= failures:
        raise ConnectionError(f"attempt {CALLS[key]} failed")
    return CALLS[key]


async def fetch(key: str) -> dict[str, Any]:
    CALLS[key] += 1
    return {"key": key, "n": CALLS[key]}


@da.durable_workflow
def uses_plain_functions(key: str) -> list[Any]:
    first = da.run_step(lookup, key, kwargs={"suffix": "!"})
    second = da.run_step(lambda: CALLS[key] * 10, name="times-ten")
    third = da.run_step(flaky, f"{key}:flaky", 2, retries=2, interval=0)
    return [first, second, third]


@da.durable_workflow
async def uses_plain_functions_async(key: str) -> list[Any]:
    fetched = await aio.run_step(fetch, key)
    looked_up = await aio.run_step(lookup, f"{key}:sync", name="sync-in-thread")
    return [fetched, looked_up]


def test_run_step_records_each_call_as_a_step_and_replays_it(runtime: da.Runtime) -> None:
    key = new_id("k")
    handle = da.start(uses_plain_functions, key)
    assert handle.result(30) == [f"{key}!", 10, 3]
    steps = handle.steps()
    assert [s.name for s in steps] == [f"{lookup.__qualname__}", "times-ten", "flaky"]
    assert steps[2].attempts == 3
    assert CALLS == {key: 1, f"{key}:flaky": 3}

    fork = da.operations.fork(handle.workflow_id, 3)  # every step replayed
    assert fork.result(30) == [f"{key}!", 10, 3]
    assert CALLS == {key: 1, f"{key}:flaky": 3}, "a replay runs none of them again"


def test_the_async_twin_awaits_coroutines_and_runs_plain_functions_in_a_thread(
    runtime: da.Runtime,
) -> None:
    key = new_id("k")
    handle = da.start(uses_plain_functions_async, key)
    assert handle.result(30) == [{"key": key, "n": 1}, f"{key}:sync"]
    assert [s.name for s in handle.steps()] == [fetch.__qualname__, "sync-in-thread"]
    fork = da.operations.fork(handle.workflow_id, 2)
    assert fork.result(30) == [{"key": key, "n": 1}, f"{key}:sync"]
    assert CALLS == {key: 1, f"{key}:sync": 1}


def test_outside_a_workflow_it_is_a_plain_call(runtime: da.Runtime) -> None:
    assert da.run_step(lookup, "outside", kwargs={"suffix": "?"}) == "outside?"
    fetched = asyncio.run(aio.run_step(fetch, "outside-async"))
    assert fetched == {"key": "outside-async", "n": 1}
    assert CALLS == {"outside": 1, "outside-async": 1}


def test_wrong_calls_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"unknown options.*retires"):
        da.run_step(lookup, "x", retires=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"aio\.run_step"):
        _ = da.run_step(fetch, "x")
    with pytest.raises(ValueError, match="timeout= needs an async step"):
        da.run_step(lookup, "x", timeout=1.0)
    with pytest.raises(TypeError, match="not callable"):
        da.run_step(42, "x")  # type: ignore[arg-type]
    assert not CALLS
