"""``set_event`` and ``close_stream`` inside a step: made in the transaction that
checkpoints the step, so exactly once with it: nothing before the checkpoint, nothing
from a failed attempt, nothing again on replay."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from tests.helpers import new_id

SEEN: dict[str, list[Any]] = {}
ATTEMPTS: Counter[str] = Counter()


@da.step
def announces(wid: str) -> str:
    da.set_event("stage", "working")
    da.set_event("stage", "done")  # the last value of a key wins, as from the body
    # not set yet: only the checkpoint sets it
    SEEN[wid] = [da.get_event(wid, "stage", timeout=0)]
    return "announced"


@da.durable_workflow
def announcer(wid: str) -> list[Any]:
    result = announces(wid)
    return [result, da.get_event(wid, "stage", timeout=0)]


def test_an_event_set_in_a_step_is_set_with_its_checkpoint(runtime: da.Runtime) -> None:
    wid = new_id("effects")
    assert da.start(announcer, wid, workflow_id=wid).result(timeout=30) == ["announced", "done"]
    assert SEEN[wid] == [None]
    assert da.get_event(wid, "stage", timeout=0) == "done"
    names = [s.name for s in da.operations.list_steps(wid)]
    assert len(names) == 2 and names[1] == "dbos_agent.get_event"  # set_event: no step


@da.step(retries=1, interval=0.01)
def flaky_announcer(wid: str) -> int:
    ATTEMPTS[wid] += 1
    SEEN.setdefault(wid, []).append(da.get_event(wid, "attempt", timeout=0))
    da.set_event("attempt", ATTEMPTS[wid])
    if ATTEMPTS[wid] == 1:
        raise RuntimeError("first attempt fails after set_event")
    return ATTEMPTS[wid]


@da.durable_workflow
def retries_an_announcement(wid: str) -> int:
    return flaky_announcer(wid)


def test_a_failed_attempt_sets_nothing_and_the_retry_sets_its_own_value(
    runtime: da.Runtime,
) -> None:
    wid = new_id("effects")
    assert da.start(retries_an_announcement, wid, workflow_id=wid).result(timeout=30) == 2
    assert SEEN[wid] == [None, None]  # the first attempt's value never went out
    assert da.get_event(wid, "attempt", timeout=0) == 2


@da.step
def always_fails(wid: str) -> None:
    da.set_event("never", True)
    da.close_stream("never")
    raise ValueError("no")


@da.durable_workflow
def records_a_failure(wid: str) -> str:
    try:
        always_fails(wid)
    except ValueError as failed:
        return f"recorded: {failed}"
    return "not recorded"


def test_a_step_that_fails_sets_and_closes_nothing(runtime: da.Runtime, engine: Engine) -> None:
    wid = new_id("effects")
    assert da.start(records_a_failure, wid, workflow_id=wid).result(timeout=30) == "recorded: no"
    assert da.get_event(wid, "never", timeout=0) is None
    rows, _ = engine.db.streams.read(wid, "never", 0)
    assert rows == []


@da.step
def speaks_and_closes(wid: str) -> str:
    da.write_stream("out", "a")  # live, as before
    da.write_stream("out", "b")
    da.close_stream("out")
    da.close_stream("out")  # a second close is no error: the stream is closed
    return "said"


@da.durable_workflow
def closes_in_a_step(wid: str) -> str:
    said = speaks_and_closes(wid)
    try:
        da.write_stream("out", "late")
    except da.errors.StreamClosedError:
        return f"{said}, then closed"
    return f"{said}, still open"


def test_a_stream_closed_in_a_step_is_closed_with_its_checkpoint(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("effects")
    handle = da.start(closes_in_a_step, wid, workflow_id=wid)
    assert handle.result(timeout=30) == "said, then closed"
    assert [i.value for i in da.read_stream(wid, "out", timeout=10)] == ["a", "b"]
    rows, _ = engine.db.streams.read(wid, "out", 0)
    assert [(r.kind, r.step_seq) for r in rows] == [("value", 0), ("value", 0), ("close", 0)]
    assert "dbos_agent.close_stream" not in [s.name for s in handle.steps()]


RUNS: Counter[str] = Counter()


@da.step
def publishes(wid: str, value: str) -> str:
    RUNS[wid] += 1
    SEEN.setdefault(wid, []).append(da.get_event(wid, "e", timeout=0))
    da.set_event("e", value)
    return value


@da.durable_workflow
def publishes_twice(wid: str) -> str:
    publishes(wid, "first")  # 0
    da.recv("go", timeout=60)  # 1
    return publishes(wid, "second")  # 2


def test_set_event_needs_a_workflow(runtime: da.Runtime) -> None:
    with pytest.raises(da.errors.NotInWorkflowError, match="inside a durable workflow"):
        da.set_event("k", 1)
    with pytest.raises(da.DbosAgentError, match="inside a durable workflow"):
        da.close_stream("k")


def test_a_rewind_before_the_step_reopens_its_stream_and_a_fork_after_it_keeps_it_closed(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("effects")
    assert da.start(closes_in_a_step, wid, workflow_id=wid).result(timeout=30) == (
        "said, then closed"
    )
    fork = da.operations.fork(wid, 1)  # the step replays: its items and close are copied
    assert fork.result(timeout=30) == "said, then closed"
    assert [i.value for i in da.read_stream(fork.workflow_id, "out", timeout=10)] == ["a", "b"]
    # the close went with the step: the re-run closes again, once
    assert da.operations.rewind(wid, 0).result(timeout=30) == "said, then closed"
    rows, _ = engine.db.streams.read(wid, "out", 0)
    assert [r.kind for r in rows] == ["value", "value", "close"]


def test_a_fork_after_the_step_has_the_event_it_set(runtime: da.Runtime) -> None:
    wid = new_id("effects")
    assert da.start(announcer, wid, workflow_id=wid).result(timeout=30) == ["announced", "done"]
    fork = da.operations.fork(wid, 1)  # the step replays: its event is copied, once
    assert fork.result(timeout=30) == ["announced", "done"]
    assert da.get_event(fork.workflow_id, "stage", timeout=0) == "done"
    again = da.operations.fork(fork.workflow_id, 1)  # the fork's step row has it too
    assert da.get_event(again.workflow_id, "stage", timeout=0) == "done"
    assert again.result(timeout=30) == ["announced", "done"]
    before = da.operations.fork(wid, 0)  # before the step: not copied, the step sets it
    assert before.result(timeout=30) == ["announced", "done"]


def test_a_rewind_before_the_step_takes_its_event_back_and_the_re_run_sets_it_once(
    runtime: da.Runtime,
) -> None:
    wid = new_id("effects")
    handle = da.start(publishes_twice, wid, workflow_id=wid)
    da.send(wid, "go", topic="go")
    assert handle.result(timeout=30) == "second"
    assert SEEN[wid] == [None, "first"] and RUNS[wid] == 2
    # back to before the second step: the event is the first step's value again
    assert da.operations.rewind(wid, 2).result(timeout=30) == "second"
    assert SEEN[wid][2:] == ["first"] and RUNS[wid] == 3
    assert da.get_event(wid, "e", timeout=0) == "second"
    # back to the start: no kept step set it, so the event is gone until step 0 runs
    assert da.operations.rewind(wid, 0).result(timeout=30) == "second"
    assert SEEN[wid][3:] == [None, "first"] and RUNS[wid] == 5
    assert da.get_event(wid, "e", timeout=0) == "second"


@da.step
def sets_k(value: str) -> str:
    da.set_event("k", value)
    return value


@da.step
def looks() -> Any:
    wid = da.current_workflow_id()
    assert wid is not None
    return da.get_event(wid, "k", timeout=0)


@da.durable_workflow
def sets_k_by_turns(wid: str) -> list[Any]:
    sets_k("step")  # 0
    first = looks()  # 1
    da.set_event("k", "body")  # 2
    second = looks()  # 3
    sets_k("step again")  # 4
    return [first, second, looks()]  # 5


def test_the_last_setter_below_the_point_wins_whichever_kind(runtime: da.Runtime) -> None:
    """A fork from, and a rewind to, each look: the look runs live and sees the value of
    the last setter below it, a step or the body's set_event."""
    wid = new_id("effects")
    seen = ["step", "body", "step again"]
    assert da.start(sets_k_by_turns, wid, workflow_id=wid).result(timeout=30) == seen
    for point in (1, 3, 5):
        assert da.operations.fork(wid, point).result(timeout=30) == seen
    for point in (5, 3, 1):
        assert da.operations.rewind(wid, point).result(timeout=30) == seen
