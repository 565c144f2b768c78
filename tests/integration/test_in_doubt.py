"""Non-idempotent steps: the intent is durable before the call; doubt is resolved, not guessed."""

from __future__ import annotations

from collections import Counter

import pytest

import dbos_agent as da
from tests.helpers import SimulatedCrash, new_id, per_test

SENT: Counter[str] = per_test(Counter())
OUTBOX: set[str] = per_test(set())
CRASH: set[str] = per_test(set())


def _already_sent(to: str) -> object:
    return f"sent to {to}" if to in OUTBOX else da.NotDone


@da.step(idempotent=False)
def send_mail(to: str) -> str:
    SENT[to] += 1
    OUTBOX.add(to)
    if to in CRASH:
        raise SimulatedCrash()  # dies after the effect, before the checkpoint
    return f"sent to {to}"


@da.step(idempotent=False, guard=_already_sent)
def send_mail_guarded(to: str) -> str:
    SENT[to] += 1
    OUTBOX.add(to)
    if to in CRASH:
        raise SimulatedCrash()
    return f"sent to {to}"


@da.durable_workflow
def notify(to: str, guarded: bool) -> str:
    return send_mail_guarded(to) if guarded else send_mail(to)


def test_the_intent_is_recorded_before_the_step_runs(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH.add("a@x")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        notify("a@x", False)
    (intent,) = da.operations.list_steps(wid)
    assert intent.status == da.records.StepStatus.PENDING and intent.inputs == {"to": "a@x"}
    assert intent.finished_at is None


def test_without_a_guard_the_workflow_stops_in_doubt_until_settled(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH.add("b@x")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        notify("b@x", False)
    CRASH.clear()
    with pytest.raises(da.errors.StepInDoubtError, match="step 0"), da.workflow_id(wid):
        notify("b@x", False)
    assert SENT["b@x"] == 1, "an in-doubt effect is never repeated by itself"
    handle = da.retrieve(wid)
    assert handle.status() == da.WorkflowStatus.IN_DOUBT
    with pytest.raises(da.errors.StepInDoubtError):
        handle.result()
    with pytest.raises(ValueError):
        da.operations.resolve_in_doubt(wid, 0)
    with pytest.raises(da.DbosAgentError, match="no in-doubt step 3"):
        da.operations.resolve_in_doubt(wid, 3, rerun=True)
    # the operator checked: the mail did go out
    resolved = da.operations.resolve_in_doubt(wid, 0, result="sent to b@x (confirmed)")
    assert resolved.result(timeout=10) == "sent to b@x (confirmed)"
    assert SENT["b@x"] == 1
    assert handle.status() == da.WorkflowStatus.SUCCESS


def test_an_operator_can_allow_a_rerun(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH.add("c@x")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        notify("c@x", False)
    CRASH.clear()
    with pytest.raises(da.errors.StepInDoubtError), da.workflow_id(wid):
        notify("c@x", False)
    assert da.operations.resolve_in_doubt(wid, 0, rerun=True).result(timeout=10) == "sent to c@x"
    assert SENT["c@x"] == 2
    assert [s.status for s in da.operations.list_steps(wid)] == [da.records.StepStatus.SUCCESS]


@pytest.mark.parametrize("happened", [True, False])
def test_the_guard_decides(runtime: da.Runtime, happened: bool) -> None:
    wid = new_id()
    CRASH.add("d@x")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        notify("d@x", True)
    CRASH.clear()
    if not happened:
        OUTBOX.clear()  # the effect did not land after all
    with da.workflow_id(wid):
        assert notify("d@x", True) == "sent to d@x"
    assert SENT["d@x"] == (1 if happened else 2)
    assert [s.status for s in da.operations.list_steps(wid)] == [da.records.StepStatus.SUCCESS]


def test_guard_requires_non_idempotent() -> None:
    with pytest.raises(ValueError, match="idempotent=False"):

        @da.step(guard=_already_sent)
        def nope(to: str) -> str:
            return to
