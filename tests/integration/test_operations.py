"""Operator actions from Python: cancel, resume, fork (and their refusals)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from tests.helpers import SimulatedCrash, new_id, per_test

RUNS: Counter[str] = per_test(Counter())
#: "key:i" -> set when turn i of key starts / the workflow reaches the pause before turn i
REACHED: dict[str, threading.Event] = per_test({})
#: "key:i" -> turn i waits for it inside the step
IN_STEP: dict[str, threading.Event] = per_test({})
#: "key:i" -> the workflow waits for it between steps, before turn i
BEFORE: dict[str, threading.Event] = per_test({})
#: keys whose tool is "fixed": turns return another answer
FIXED: set[str] = per_test(set())
CRASH: set[str] = per_test(set())


def _wait(event: threading.Event) -> None:
    assert event.wait(10), "the test gate was never opened"


@da.step
def turn(key: str, i: int) -> str:
    RUNS[f"{key}:{i}"] += 1
    if (reached := REACHED.get(f"{key}:{i}")) is not None:
        reached.set()
    if (gate := IN_STEP.get(f"{key}:{i}")) is not None:
        _wait(gate)
    return f"{'fixed' if key in FIXED else 'turn'} {i}"


@da.durable_workflow
def agent(key: str, n: int) -> list[str]:
    answers = []
    for i in range(n):
        if (gate := BEFORE.get(f"{key}:{i}")) is not None:
            REACHED[f"{key}:{i}"].set()
            _wait(gate)
        answers.append(turn(key, i))
    if key in CRASH:
        raise SimulatedCrash()
    return answers


def _reach(key: str, i: int, *, in_step: bool) -> threading.Event:
    """Make the workflow stop before (or inside) turn i; return the gate that releases it."""
    REACHED[f"{key}:{i}"] = threading.Event()
    gate = threading.Event()
    (IN_STEP if in_step else BEFORE)[f"{key}:{i}"] = gate
    return gate


def test_cancel_stops_a_running_workflow_before_its_next_step(runtime: da.Runtime) -> None:
    wid = new_id()
    gate = _reach(wid, 1, in_step=False)
    handle = da.start(agent, wid, 3, workflow_id=wid)
    _wait(REACHED[f"{wid}:1"])
    assert da.operations.cancel(wid) == da.WorkflowStatus.PENDING
    gate.set()
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=10)
    assert RUNS[f"{wid}:1"] == 0, "no step starts after the cancel"
    assert handle.status() == da.WorkflowStatus.CANCELLED
    assert [s.seq for s in handle.steps()] == [0]
    with pytest.raises(da.WorkflowCancelledError):
        da.retrieve(wid).result(timeout=5)
    assert da.operations.cancel(wid) == da.WorkflowStatus.CANCELLED, "cancelling again is a no-op"


def test_cancel_mid_step_then_resume_continues_from_the_log(runtime: da.Runtime) -> None:
    wid = new_id()
    gate = _reach(wid, 1, in_step=True)
    handle = da.start(agent, wid, 3, workflow_id=wid)
    _wait(REACHED[f"{wid}:1"])
    da.operations.cancel(wid)
    gate.set()  # the step finishes, but its checkpoint is refused
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=10)
    assert [s.seq for s in handle.steps()] == [0]
    assert RUNS[f"{wid}:2"] == 0

    resumed = da.operations.resume(wid)
    assert resumed.result(timeout=10) == ["turn 0", "turn 1", "turn 2"]
    assert resumed.status() == da.WorkflowStatus.SUCCESS
    # step 0 was recorded and replayed; step 1 was cut off by the cancel and ran again
    assert RUNS == Counter({f"{wid}:0": 1, f"{wid}:1": 2, f"{wid}:2": 1})
    info = resumed.get_info()
    assert info.error is None and info.executor_id == runtime.executor_id


def test_resume_while_the_cancelled_run_is_still_in_its_step(runtime: da.Runtime) -> None:
    """Cancel and resume before the old run reaches its next step: it simply goes on."""
    wid = new_id()
    gate = _reach(wid, 1, in_step=True)
    first = da.start(agent, wid, 3, workflow_id=wid)
    _wait(REACHED[f"{wid}:1"])
    da.operations.cancel(wid)
    resumed = da.operations.resume(wid)
    gate.set()
    assert resumed.result(timeout=10) == ["turn 0", "turn 1", "turn 2"]
    assert first.result(timeout=10) == ["turn 0", "turn 1", "turn 2"]
    assert RUNS == Counter({f"{wid}:0": 1, f"{wid}:1": 1, f"{wid}:2": 1})


@da.durable_workflow(max_recovery_attempts=0)
def fragile(key: str) -> list[str]:
    first = turn(key, 0)
    if key in CRASH:
        raise SimulatedCrash()  # the process "dies": the workflow stays PENDING
    return [first, turn(key, 1)]


def test_resume_a_dead_lettered_workflow(dbos_agent_database_url: str, executor_id: str) -> None:
    url, wid = dbos_agent_database_url, new_id()
    rt = da.launch(url, executor_id=executor_id, workers=2)
    try:
        CRASH.add(wid)
        with pytest.raises(SimulatedCrash), da.workflow_id(wid):
            fragile(wid)
    finally:
        rt.shutdown()
    CRASH.clear()
    rt = da.launch(url, executor_id=executor_id, workers=2)  # recovery dead-letters it
    try:
        rt.wait_for_recovery(20)
        handle = da.retrieve(wid)
        assert handle.status() == da.WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED
        resumed = da.operations.resume(wid)
        assert resumed.result(timeout=10) == ["turn 0", "turn 1"]
        assert RUNS == Counter({f"{wid}:0": 1, f"{wid}:1": 1})
        assert handle.get_info().recovery_attempts == 0
    finally:
        rt.shutdown()


def test_fork_reuses_the_steps_before_n_and_runs_the_rest_live(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        assert agent(wid, 4) == ["turn 0", "turn 1", "turn 2", "turn 3"]
    FIXED.add(wid)  # "fix the tool", then rerun from turn 2

    fork = da.operations.fork(wid, from_step=2)
    assert fork.workflow_id != wid
    assert fork.result(timeout=10) == ["turn 0", "turn 1", "fixed 2", "fixed 3"]
    assert RUNS == Counter({f"{wid}:0": 1, f"{wid}:1": 1, f"{wid}:2": 2, f"{wid}:3": 2})
    original_steps = da.operations.list_steps(wid)
    fork_steps = fork.steps()
    assert [s.seq for s in fork_steps] == [0, 1, 2, 3]
    assert [s.started_at for s in fork_steps[:2]] == [s.started_at for s in original_steps[:2]]
    info = fork.get_info()
    assert (info.name, info.inputs, info.status) == ("agent", {"key": wid, "n": 4}, "SUCCESS")
    assert engine.db.operations.fork_origin(fork.workflow_id) == (wid, 2)
    assert engine.db.operations.fork_origin(wid) is None

    named = da.operations.fork(wid, 0, new_workflow_id=f"{wid}-again")
    assert named.workflow_id == f"{wid}-again"
    assert named.result(timeout=10) == ["fixed 0", "fixed 1", "fixed 2", "fixed 3"]
    assert da.operations.fork(wid, 4).result(timeout=10) == ["turn 0", "turn 1", "turn 2", "turn 3"]


def test_unknown_ids_and_wrong_states_are_refused(runtime: da.Runtime) -> None:
    missing = new_id("missing")
    for action in (
        lambda: da.operations.cancel(missing),
        lambda: da.operations.resume(missing),
        lambda: da.operations.fork(missing, 0),
        lambda: da.operations.resolve_in_doubt(missing, 0, rerun=True),
    ):
        with pytest.raises(da.WorkflowNotFoundError, match=missing):
            action()

    wid = new_id()
    with da.workflow_id(wid):
        done = agent(wid, 2)
    with pytest.raises(da.errors.WorkflowStatusError, match="already finished with status SUCCESS"):
        da.operations.cancel(wid)
    assert da.operations.resume(wid).result(timeout=30) == done  # DBOS: a no-op
    assert da.operations.fork(wid, 3).from_step == 2  # past the end: from the end (DBOS)
    with pytest.raises(ValueError, match=">= 0"):
        da.operations.fork(wid, -1)
    with pytest.raises(da.errors.WorkflowIdConflictError, match="already taken"):
        da.operations.fork(wid, 1, new_workflow_id=wid)
    assert da.retrieve(wid).status() == da.WorkflowStatus.SUCCESS

    pending = new_id()
    gate = _reach(pending, 0, in_step=False)
    handle = da.start(agent, pending, 1, workflow_id=pending)
    _wait(REACHED[f"{pending}:0"])
    with pytest.raises(da.errors.WorkflowStatusError, match="it is PENDING; it has not stopped"):
        da.operations.resume(pending)
    gate.set()
    assert handle.result(timeout=10) == ["turn 0"]


def test_a_cancel_from_the_storage_layer_alone_stops_the_run(
    runtime: da.Runtime, engine: Engine
) -> None:
    """As from the CLI: no in-process call; the NOTIFY or the refused checkpoint stops it."""
    wid = new_id()
    gate = _reach(wid, 0, in_step=True)
    handle = da.start(agent, wid, 2, workflow_id=wid)
    _wait(REACHED[f"{wid}:0"])
    from dbos_agent._engine.operations import cancel_workflow

    assert cancel_workflow(engine.db, wid) == da.WorkflowStatus.PENDING  # no in-process flag
    gate.set()
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=60)
    assert RUNS[f"{wid}:1"] == 0 and handle.steps() == []


@da.step(idempotent=False)
def pay(key: str) -> str:
    RUNS[f"pay:{key}"] += 1
    if key in CRASH:
        raise SimulatedCrash()  # after the effect, before the checkpoint
    return f"paid {key}"


@da.durable_workflow
def checkout(key: str) -> str:
    return f"{turn(key, 0)}, {pay(key)}"


def test_doubt_is_never_lost_by_cancel_resume_or_fork(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH.add(wid)
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        checkout(wid)
    CRASH.clear()
    with pytest.raises(da.errors.StepInDoubtError), da.workflow_id(wid):
        checkout(wid)
    with pytest.raises(
        da.errors.WorkflowStatusError, match=r"step 1 is still in doubt.*steps resolve"
    ):
        da.operations.resume(wid)
    with pytest.raises(da.DbosAgentError, match="its step 1 is in doubt"):
        da.operations.fork(wid, 2)

    assert da.operations.cancel(wid) == da.WorkflowStatus.IN_DOUBT
    with pytest.raises(da.errors.StepInDoubtError):  # resumed, it stops at the same intent again
        da.operations.resume(wid).result(timeout=10)
    assert da.retrieve(wid).status() == da.WorkflowStatus.IN_DOUBT
    assert RUNS[f"pay:{wid}"] == 1

    redo = da.operations.fork(
        wid, 1
    )  # from the doubtful step on purpose: it runs again, in the fork
    assert redo.result(timeout=10) == f"turn 0, paid {wid}"
    assert RUNS[f"pay:{wid}"] == 2 and RUNS[f"{wid}:0"] == 1
